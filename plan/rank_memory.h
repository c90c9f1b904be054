// The predicted peak of every rank of a Touchstone run's layout (all tp, cp and dp ranks and pipeline
// stages), as a sum a reader can check term by term:
//
//   total = model state                  weights + grads (8 + 8 bytes per parameter the rank's ShardPlan
//                                        holds) + Adam moments (16 bytes per parameter, or per element of
//                                        the distributed optimizer's chunk)
//         + activations                  the stored activations live at the peak: of the micro-batches
//                                        stored then (the schedule's in-flight count when the peak is in a
//                                        backward), the one in its backward has freed some of its own
//         + transient                    the working buffers live at the peak (pass gradients, received
//                                        inputs, token-loss records, optimizer buffers)
//         + arena free                   the part of the activation arena's block no buffer uses at the
//                                        peak (common/activation_arena.h: the block is laid out after the
//                                        first step and stays allocated, so from the second step on the
//                                        stored and working buffers above live inside it)
//         + communication staging        each group's reduction scratch and the copies of pending sends
//
// The copies of pipeline sends live until the peer has received them, which depends on timing: the
// prediction frees each at the earliest moment the code can (the stage's next send), and
// total_sends_held is the same replay with every copy held until the stage's sends are waited for, an
// upper bound for any timing.
//
// All of it comes from one replay per rank (fp64_trainer_memory.h); memory_per_rank compares these
// numbers with the peaks measured at every rank of an MPI run.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "common/config.h"
#include "plan/buffer_tally.h"
#include "plan/memory_model.h"

namespace touchstone::plan {

struct RankMemory {
  int world_rank = 0;
  int64_t tp_rank = 0, cp_rank = 0, dp_rank = 0, stage = 0;
  ModelState state;
  int64_t in_flight = 0;  // most micro-batches the stage stores at once under its schedule
  double stored_per_micro_batch = 0;
  PeakSnapshot peak;  // beyond the model state
  double total_sends_held = 0;

  double activations() const { return peak.stored; }
  double arena_free() const { return peak.arena; }
  double transient() const { return peak.at.bytes - activations() - arena_free() - peak.staging; }
  double total() const { return state.total() + peak.at.bytes; }
};

// One entry per world rank, in world-rank order (parallel/comm/grid.h). `config` must be valid for its
// world size (validate_config) and in precision fp64.
std::vector<RankMemory> predict_rank_memory(const Config& config);
// Throws InputError when replaying every rank of `config` would take more than a few seconds
// (plan/memory_plan.h kMaxFp64ReplayedLayerMicroBatches): `plan memory --ranks` checks it first.
void check_rank_replay_size(const Config& config);

// The per-rank table and each rank's staging buffers.
void print_rank_memory(const std::vector<RankMemory>& ranks, std::ostream& out);

}  // namespace touchstone::plan
