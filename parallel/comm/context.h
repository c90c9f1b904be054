// The process groups a training step talks to, and where this rank sits in the grid. A Grid (MPI)
// provides one; SingleProcessContext provides the one-rank case without MPI.
#pragma once

#include <cstdint>
#include <string_view>

#include "parallel/comm/grid.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/single_rank_group.h"

namespace touchstone {

// Called with (step, phase) wherever a step marks its phase. Injected process faults
// (checkpoint/fault_injection.h) install one to kill a rank at an exact point; none is installed
// otherwise. One per process.
using PhaseHook = void (*)(int64_t step, std::string_view phase);
void install_phase_hook(PhaseHook hook);
PhaseHook phase_hook();

struct ParallelContext {
  ProcessGroup& world;
  ProcessGroup& tp;
  ProcessGroup& cp;         // context parallelism: the ranks holding the chunks of the same windows
  ProcessGroup& dp;         // the replicas reading different micro-batches
  ProcessGroup& dp_cp;      // dp x cp: the ranks whose gradients sum to the same tensors' (dp when cp = 1)
  ProcessGroup& pp;         // group rank == pipeline stage
  ProcessGroup& embedding;  // first and last stage (tied embeddings); one rank otherwise
  TraceContext* trace;      // updated with step / micro-batch / phase for trace records; may be null
  GridLayout layout;
  GridCoordinates coordinates;

  int stage() const { return pp.rank(); }
  int global_rank_of(int tp_rank, int dp_rank, int stage, int cp_rank = 0) const {
    return rank_of(layout, GridCoordinates{tp_rank, dp_rank, stage, cp_rank});
  }
  bool first_stage() const { return pp.rank() == 0; }
  bool last_stage() const { return pp.rank() == pp.size() - 1; }
  // Marks where the step is, for the trace and for the phase hook (an injected process fault); `chunk`
  // names the model chunk with virtual pipeline stages.
  void set_phase(int64_t step, int64_t micro_batch, const char* phase, int64_t chunk = -1) const {
    if (trace) *trace = TraceContext{step, micro_batch, phase, chunk};
    if (PhaseHook hook = phase_hook()) hook(step, phase);
  }
};

inline ParallelContext context_of(Grid& grid) {
  return ParallelContext{grid.world(), grid.tp(),        grid.cp(),       grid.dp(),     grid.dp_cp(),
                         grid.pp(),    grid.embedding(), &grid.context(), grid.layout(), grid.coordinates()};
}

// Seven one-rank groups: the whole model on this process.
class SingleProcessContext {
 public:
  ParallelContext context() {
    return ParallelContext{world_, tp_, cp_, dp_, dp_cp_, pp_, embedding_, nullptr, {}, {}};
  }

 private:
  SingleRankGroup world_{"world"}, tp_{"tp"}, cp_{"cp"}, dp_{"dp"}, dp_cp_{"dp_cp"}, pp_{"pp"},
      embedding_{"embedding"};
};

}  // namespace touchstone
