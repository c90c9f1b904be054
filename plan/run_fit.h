// The one memory check before a run allocates: the bytes one process of `touchstone golden` or
// `touchstone train` will hold (the memory planner's per-rank peak of the trainer, plus what the run
// keeps beside it: every step's batch, the packed windows, the full initial weights, the gathered
// outputs) against the memory of the machine. A closed form that allocates nothing is checked first,
// so a size far beyond the machine is refused without building the planner's parameter table either.
// docs/config.md#limits-and-the-memory-check.
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"

namespace touchstone::plan {

// What the run writes besides training, on world rank 0 (oracle/run.h RunOptions).
struct RunOutputs {
  bool golden = false;                // gathers full gradients and parameters every step
  bool save_optimizer_state = false;  // and the full AdamW moments
  bool envelope = false;              // keeps every step's low-precision outputs until the FP64 run
  bool checkpoints = false;           // saves checkpoints (reads the AdamW moments after the last step)
};

// The memory one process may plan to use, and where the number comes from.
struct MemoryBudget {
  double bytes = 0;
  std::string source;  // "physical memory 24.6 GB / 1 process(es) on this node", or the limit given
};

// Physical memory of this machine (not what is free now: a check must not depend on other processes),
// shared by the processes of the job on this node (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE or MPICH's
// MPI_LOCALNRANKS; without either, all `world_size` processes). `limit_gb` > 0 replaces it.
MemoryBudget memory_budget(int world_size, double limit_gb);

// Bytes per process no run of `config` can go below, from closed forms only: the full initial weights,
// the model state of a 1/(tp x pp) share, every step's batch, one window, one layer's attention
// probabilities, the outputs on rank 0. Needs check_ranges' limits (validate_config), not the planner.
double lower_bound_bytes(const Config& config, const RunOutputs& outputs);

// The planner's peak of the largest rank (plan/rank_memory.h) plus what the run holds beside the
// trainer. `config` must be valid (validate_config) for its world size.
double planned_bytes(const Config& config, const RunOutputs& outputs);

// Validates `config` for `world_size` processes, then throws InputError when the lower bound or the
// planned bytes exceed `budget`: one line with both numbers and the override.
void check_run_fits(const Config& config, const RunOutputs& outputs, int world_size,
                    const MemoryBudget& budget);

}  // namespace touchstone::plan
