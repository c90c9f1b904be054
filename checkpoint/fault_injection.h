// Process failures on purpose, for recovery tests: an armed ProcessFault (the command line's
// `--fail-at step:rank[:phase]`) makes world rank `rank` die abruptly (SIGKILL: no clean-up, no MPI_Finalize,
// no flushing) when it reaches `phase` of update `step`. Phases: forward, backward, optimizer
// (ParallelContext::set_phase marks them as the step runs) and save (the middle of a checkpoint save, after
// the parameters are written and before the optimizer state is).
//
// Just before dying, the rank appends one line to a record file (`faults.jsonl` in the checkpoint
// directory) so that a recovery report can state when the failure happened, not only when it was seen.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace touchstone {

struct ProcessFault {
  int64_t step = 0;  // >= 1
  int rank = 0;      // >= 0
  std::string phase = "forward";
};

// Whether `phase` is one a fault can fire in: forward, backward, optimizer or save.
bool is_fault_phase(std::string_view phase);

// Arms the fault in this process (world rank `world_rank`); `record_path` may be empty (no record).
// A fault fires once: when `record_path` already holds its record, it is not armed again, so that a
// job restarted with the same command line continues past it.
void arm_process_fault(const ProcessFault& fault, int world_rank, std::string record_path);

// Dies here when an armed fault matches (step, phase) on this rank; otherwise returns at once.
void process_fault_point(int64_t step, std::string_view phase);

}  // namespace touchstone
