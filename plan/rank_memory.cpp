// Per-rank prediction: one replay for every grid coordinate, and its printed table.
#include "plan/rank_memory.h"

#include <cstdio>
#include <ostream>

#include "parallel/comm/grid.h"
#include "plan/checked.h"
#include "plan/format.h"
#include "plan/fp64_trainer_memory.h"
#include "plan/memory_plan.h"

namespace touchstone::plan {

void check_rank_replay_size(const Config& config) {
  const MemoryPlanInput in = plan_input_from_config(config);
  validate(in);
  const int64_t replayed = fp64_replayed_layer_micro_batches(in, config.parallel.dp);
  checked_product({config.parallel.world_size(), replayed, replayed},
                  kMaxFp64ReplayedLayerMicroBatches * kMaxFp64ReplayedLayerMicroBatches,
                  "the per-rank replay: ranks x (a stage's layers x micro-batches)^2");
}

std::vector<RankMemory> predict_rank_memory(const Config& config) {
  const MemoryPlanInput in = plan_input_from_config(config);
  validate(in);
  const int64_t dp = config.parallel.dp;
  const int64_t micro_batches = config.train.global_batch_size / (dp * config.train.micro_batch_size);
  const GridLayout layout = grid_layout(config.parallel);
  // Every rank is replayed (twice): all ranks' steps together are bounded as one plan's are.
  const int64_t per_rank = checked_add(in.shape.layers,
                                       checked_product({micro_batches, in.virtual_stages}, kMaxReplaySteps,
                                                       "the per-rank replay: micro-batches x virtual stages"),
                                       "the per-rank replay: layers + micro-batches x virtual stages");
  checked_product({static_cast<int64_t>(layout.world_size()), per_rank}, kMaxReplaySteps,
                  "the per-rank replay: ranks x (layers + micro-batches x virtual stages)");
  std::vector<RankMemory> ranks;
  for (int world_rank = 0; world_rank < layout.world_size(); ++world_rank) {
    const GridCoordinates c = coordinates_of(layout, world_rank);
    Fp64Rank rank = fp64_rank(in, dp, micro_batches, c.pp_rank, c.tp_rank, c.dp_rank, c.cp_rank);
    const Fp64StepReplay replay = replay_fp64_step(rank);
    rank.send_completion = SendCompletion::kAtWaitSends;
    const double peak_sends_held = replay_fp64_step(rank).peak.at.bytes;
    RankMemory r;
    r.world_rank = world_rank;
    r.tp_rank = c.tp_rank;
    r.dp_rank = c.dp_rank;
    r.cp_rank = c.cp_rank;
    r.stage = c.pp_rank;
    r.state = model_state(rank.params(), in.recipe, 0, 1);
    // The distributed optimizer keeps moments for its chunk of the padded flat buffer, not params / dp
    // (dp x cp with context parallelism).
    if (rank.zero_stage == 1) r.state.moments = in.recipe.moments * rank.chunk();
    // Zero stages 2 and 3: moments of each tensor's padded dim-0 shard. The step's gradients are in the
    // replay (full until reduce-scattered at stage 2, shards at stage 3). Stage 2's weights come back
    // from each step's all-gather in buffers of dp shards; stage 3 keeps shards.
    if (rank.zero_stage >= 2) {
      r.state.moments = in.recipe.moments * rank.shards();
      r.state.grads = 0;
      double gathered = 0;
      for (const HeldTensor& t : rank.held) gathered += rank.gathered(t);
      r.state.weights = in.recipe.weights * (rank.zero_stage == 2 ? gathered : rank.shards());
    }
    if (in.moments_dropped) r.state.moments = 0;
    r.in_flight = replay.in_flight;
    r.stored_per_micro_batch = replay.stored_per_micro_batch;
    r.peak = replay.peak;
    r.total_sends_held = r.state.total() + peak_sends_held;
    ranks.push_back(r);
  }
  return ranks;
}

void print_rank_memory(const std::vector<RankMemory>& ranks, std::ostream& out) {
  out << "\nPer rank, bytes (the run's peak: its second step, once the communication scratch has grown):\n";
  char line[512];
  std::snprintf(line, sizeof line, "%5s %3s %3s %3s %5s %11s %7s %30s %11s %11s %11s %11s  %s\n", "rank",
                "tp", "cp", "dp", "stage", "state", "flight", "activations (k stored)", "transient",
                "arena free", "staging", "total", "peak at");
  out << line;
  for (const RankMemory& r : ranks) {
    const std::string activations =
        std::to_string(r.peak.stored_micro_batches) + ": " + grouped(r.activations());
    std::snprintf(line, sizeof line, "%5d %3lld %3lld %3lld %5lld %11s %7lld %30s %11s %11s %11s %11s  %s\n",
                  r.world_rank, static_cast<long long>(r.tp_rank), static_cast<long long>(r.cp_rank),
                  static_cast<long long>(r.dp_rank), static_cast<long long>(r.stage),
                  grouped(r.state.total()).c_str(), static_cast<long long>(r.in_flight), activations.c_str(),
                  grouped(r.transient()).c_str(), grouped(r.arena_free()).c_str(),
                  grouped(r.peak.staging).c_str(), grouped(r.total()).c_str(), r.peak.at.name.c_str());
    out << line;
  }
  out << "Staging buffers live at each rank's peak:\n";
  for (const RankMemory& r : ranks) {
    out << "  rank " << r.world_rank << ":";
    if (r.peak.staging_buffers.empty()) out << " none";
    for (size_t i = 0; i < r.peak.staging_buffers.size(); ++i) {
      const NamedBytes& b = r.peak.staging_buffers[i];
      out << (i == 0 ? " " : "; ") << b.name << " " << grouped(b.bytes);
    }
    out << "\n";
  }
}

}  // namespace touchstone::plan
