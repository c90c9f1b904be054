// Which parameters one rank holds, and in what shape: the pipeline stage decides which tensors
// (its layers; the embedding on the first stage; the final norm and output layer on the last; a tied
// embedding on both), tensor parallelism decides which shard of each (parallel/tensor/sharding.h).
// Data-parallel replicas hold the same shards.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "model/param_table.h"
#include "model/transformer.h"

namespace touchstone {

class ShardPlan {
 public:
  ShardPlan(const ParamTable& table, const Config& config, int tp_rank, int tp_size, int stage);

  const ParamTable& table() const { return table_; }
  const StageRange& stage_range() const { return range_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }

  bool holds(int id) const { return holds_[static_cast<size_t>(id)]; }
  const std::vector<int>& held_ids() const { return held_ids_; }
  std::vector<int64_t> local_shape(int id) const;
  int64_t local_numel(int id) const;

  // The pipeline stage whose copy is the parameter (a tied embedding belongs to the first stage; the
  // last stage's copy is kept equal to it).
  int owner_stage(int id) const;
  // True when this rank's shard is the one counted in the gradient norm and written to outputs:
  // held, on the owner stage, and for a replicated tensor only on tp rank 0.
  bool is_primary(int id) const;

  ParamTensors shard(const ParamTensors& full) const;  // tensors not held stay empty
  ParamTensors zeros() const;

 private:
  const ParamTable& table_;
  int tp_rank_, tp_size_, stage_;
  StageRange range_;
  std::vector<int64_t> stage_boundaries_;
  std::vector<bool> holds_;
  std::vector<int> held_ids_;
};

}  // namespace touchstone
