// Stage and tensor-parallel ownership of every parameter.
#include "parallel/shard_plan.h"

#include <algorithm>

#include "parallel/tensor/sharding.h"

namespace touchstone {

ShardPlan::ShardPlan(const ParamTable& table, const Config& config, int tp_rank, int tp_size, int stage)
    : table_(table),
      tp_rank_(tp_rank),
      tp_size_(tp_size),
      stage_(stage),
      num_stages_(static_cast<int>(config.parallel.pp)),
      stage_boundaries_(config.stage_boundaries()) {
  const auto num_virtual = static_cast<int>(stage_boundaries_.size()) - 1;
  for (int virtual_stage = stage; virtual_stage < num_virtual; virtual_stage += num_stages_) {
    const auto k = static_cast<size_t>(virtual_stage);
    chunks_.push_back(StageRange{stage_boundaries_[k], stage_boundaries_[k + 1], virtual_stage == 0,
                                 virtual_stage == num_virtual - 1});
  }
  holds_.assign(static_cast<size_t>(table.size()), false);
  for (int id = 0; id < table.size(); ++id) {
    // A layer's tensors are held by the stage of its virtual stage, the others by their owner stage;
    // the last stage also holds a tied embedding's second copy.
    bool held = owner_stage(id) == stage || (id == table.output() && stage == num_stages_ - 1);
    holds_[static_cast<size_t>(id)] = held;
    if (held) held_ids_.push_back(id);
  }
}

int ShardPlan::owner_stage(int id) const {
  const ParamSpec& spec = table_[id];
  if (spec.kind == ParamKind::kEmbedding) return 0;
  if (spec.kind == ParamKind::kOutput || spec.kind == ParamKind::kFinalNorm) return num_stages_ - 1;
  const auto it = std::upper_bound(stage_boundaries_.begin(), stage_boundaries_.end(), spec.layer);
  const auto virtual_stage = static_cast<int>(it - stage_boundaries_.begin()) - 1;
  return virtual_stage % num_stages_;
}

bool ShardPlan::is_primary(int id) const {
  return holds(id) && owner_stage(id) == stage_ &&
         (table_[id].sharding != Sharding::kReplicated || tp_rank_ == 0);
}

std::vector<int64_t> ShardPlan::local_shape(int id) const {
  return shard_shape(table_[id].sharding, table_[id].shape, tp_size_);
}

int64_t ShardPlan::local_numel(int id) const {
  int64_t n = 1;
  for (int64_t d : local_shape(id)) n *= d;
  return n;
}

ParamTensors ShardPlan::shard(const ParamTensors& full) const {
  ParamTensors local;
  local.tensors.resize(static_cast<size_t>(table_.size()));
  for (int id : held_ids_)
    local[id] = shard_of(table_[id].sharding, table_[id].shape, full[id], tp_rank_, tp_size_);
  return local;
}

ParamTensors ShardPlan::zeros() const {
  ParamTensors local;
  local.tensors.resize(static_cast<size_t>(table_.size()));
  for (int id : held_ids_) local[id].assign(static_cast<size_t>(local_numel(id)), 0.0);
  return local;
}

}  // namespace touchstone
