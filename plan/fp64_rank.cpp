// The rank a plan of Touchstone's FP64 trainer describes: its tensors from a ShardPlan of the parameter
// table (the code the trainer itself uses), its model chunks and sizes, and the planner input of a
// Touchstone config. The replay of its steps is in fp64_trainer_memory.cpp.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/errors.h"
#include "kernels/cpu/parallel_for.h"
#include "model/param_table.h"
#include "parallel/shard_plan.h"
#include "plan/fp64_trainer_memory.h"

namespace touchstone::plan {

double Fp64Rank::params() const {
  return std::accumulate(held.begin(), held.end(), 0.0,
                         [](double sum, const HeldTensor& t) { return sum + t.numel; });
}

double Fp64Rank::shards() const {
  return std::accumulate(held.begin(), held.end(), 0.0,
                         [this](double sum, const HeldTensor& t) { return sum + shard(t); });
}

double Fp64Rank::flat_size() const {
  const auto d = static_cast<double>(dp_cp());
  return std::ceil(params() / d) * d;
}

namespace {

Config config_for(const MemoryPlanInput& in) {
  Config c;
  const ModelShape& s = in.shape;
  c.model.vocab_size = s.vocab;
  c.model.hidden_size = s.hidden;
  c.model.num_layers = s.layers;
  c.model.num_heads = s.heads;
  c.model.num_kv_heads = s.kv_heads;
  c.model.ffn_hidden_size = s.ffn;
  c.model.seq_length = s.seq;
  c.model.tie_embeddings = s.tied_embeddings;
  c.parallel.tp = in.tp;
  c.parallel.pp = in.pp;
  c.parallel.virtual_stages = in.virtual_stages;
  c.parallel.stage_layers = in.stage_layers;
  return c;
}

}  // namespace

Fp64Rank fp64_rank(const MemoryPlanInput& in, int64_t dp, int64_t micro_batches, int64_t stage,
                   int64_t tp_rank, int64_t dp_rank, int64_t cp_rank) {
  Fp64Rank rank;
  rank.shape = in.shape;
  rank.micro_batch = in.micro_batch;
  rank.micro_batches = micro_batches;
  rank.tp = in.tp;
  rank.pp = in.pp;
  rank.dp = dp;
  rank.cp = in.cp;
  rank.cp_rank = cp_rank;
  rank.cp_comm = in.cp_comm;
  rank.tp_rank = tp_rank;
  rank.dp_rank = dp_rank;
  rank.stage = stage;
  rank.schedule = in.schedule;
  rank.sequence_parallel = in.sequence_parallel;
  rank.zero_stage = std::max<int64_t>(in.zero_stage, in.distributed_optimizer ? 1 : 0);
  rank.distributed_optimizer = rank.zero_stage >= 1;
  rank.kernel_threads = in.kernel_threads;
  rank.hidden_dropout = in.hidden_dropout;
  rank.moments_dropped = in.moments_dropped;
  const Config config = config_for(in);
  const ParamTable table(config.model);
  const ShardPlan plan(table, config, static_cast<int>(tp_rank), static_cast<int>(in.tp),
                       static_cast<int>(stage));
  for (const StageRange& range : plan.chunk_ranges())
    rank.chunks.push_back(
        {range.first_layer, range.end_layer - range.first_layer, range.first_stage, range.last_stage});
  for (int id : plan.held_ids()) {
    rank.held.push_back({static_cast<double>(plan.local_numel(id)),
                         table[id].sharding == Sharding::kReplicated, id == table.embedding(),
                         static_cast<double>(plan.local_shape(id)[0]), table[id].layer,
                         id == table.final_norm() || id == table.output()});
  }
  return rank;
}

MemoryPlanInput plan_input_from_config(const Config& c) {
  MemoryPlanInput in;
  const ModelConfig& m = c.model;
  in.shape = ModelShape{m.num_layers,      m.hidden_size, m.num_heads,  m.num_kv_heads,
                        m.ffn_hidden_size, m.vocab_size,  m.seq_length, m.tie_embeddings};
  in.recipe = find_recipe("fp64");
  in.distributed_optimizer = c.parallel.distributed_optimizer;
  in.zero_stage = c.parallel.zero();
  in.tp = c.parallel.tp;
  in.pp = c.parallel.pp;
  in.cp = c.parallel.cp;
  in.cp_comm = c.parallel.cp_comm;
  in.virtual_stages = c.parallel.virtual_stages;
  in.dps = {c.parallel.dp};
  in.stage_layers = c.parallel.stage_layers;
  in.schedule = c.parallel.schedule;
  in.micro_batch = c.train.micro_batch_size;
  in.global_batch = c.train.global_batch_size;
  in.sequence_parallel = c.parallel.sequence_parallel;
  in.kernel_threads = cpu::kernel_threads();
  in.hidden_dropout = m.hidden_dropout > 0.0;
  in.moments_dropped = c.train.steps == 1;
  in.activations = ActivationModel::kTouchstoneFp64;
  in.trainer_precision = c.precision;
  return in;
}

StepPeakPrediction predict_single_process_step(const Config& config) {
  MemoryPlanInput in = plan_input_from_config(config);
  in.tp = in.pp = in.cp = in.virtual_stages = 1;
  in.dps = {1};
  in.stage_layers.clear();
  validate(in);
  StepPeakPrediction prediction;
  prediction.stage = plan_layout(in, 1).stages.front();
  prediction.state = prediction.stage.state;
  prediction.total = prediction.stage.total();
  return prediction;
}

}  // namespace touchstone::plan
