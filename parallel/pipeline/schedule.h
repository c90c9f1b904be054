// Pipeline schedules as data: the ordered list of actions each stage runs in one optimizer step,
// computed before the step so that it can be checked (order, deadlock freedom, memory) without
// running a model, and compared with the record of what the executor actually ran.
//
// Schedules, for p stages and m micro-batches (stage s, micro-batch j):
//   "afab"  all-forward-all-backward (GPipe): F0..F(m-1), then B0..B(m-1). Backwards run in
//           ascending order, the order the forwards ran in, so that the gradients are accumulated
//           in the same micro-batch order on every stage and in every schedule.
//   "1f1b"  one-forward-one-backward with a flush (PipeDream-Flush; Megatron-LM's
//           forward_backward_pipelining_without_interleaving): w = min(p - s - 1, m) warm-up
//           forwards, then m - w steady-state pairs (forward of the next micro-batch, then backward
//           of the oldest), then the w remaining backwards. Backwards run in ascending order too.
// Transfers around every computation:
//   forward j:  RecvActivation(j) from s - 1 (unless s == 0) before, SendActivation(j) to s + 1 (unless
//               s == p - 1) after
//   backward j: RecvGradient(j) from s + 1 (unless s == p - 1) before, SendGradient(j) to s - 1 (unless
//               s == 0) after
//
// Execution model the schedules are checked against (and that the executor must honour): sends are
// non-blocking, receives block, and messages are matched by (micro-batch, direction) tags, not by
// arrival order. Blocking receives and non-blocking sends make the stages a Kahn process network, so
// whether a schedule deadlocks, and the simulated times, do not depend on how the stages interleave.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/options.h"  // PipelineSchedule: parallel.schedule, parsed with the config
#include "parallel/pipeline/timeline.h"

namespace touchstone::pipeline {

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;
  int peer_stage = -1;  // the other stage of a send or receive; -1 for a forward or backward

  friend bool operator==(const Action&, const Action&) = default;
};

// The complete ordered list for `stage`. Throws std::invalid_argument for num_stages < 1, stage outside
// [0, num_stages) or num_micro_batches < 1.
std::vector<Action> build_schedule(PipelineSchedule schedule, int num_stages, int stage,
                                   int num_micro_batches);

// Every stage's list, index = stage.
std::vector<std::vector<Action>> build_all_schedules(PipelineSchedule schedule, int num_stages,
                                                     int num_micro_batches);

// Space-separated tokens (timeline.h), the expected counterpart of render_order() of a record.
std::string format_actions(const std::vector<Action>& actions, bool include_communication = false);

// The most micro-batches whose forward has run and whose backward has not, at any point of the list:
// how many sets of activations the stage must hold at once.
int peak_in_flight(const std::vector<Action>& actions);

struct UnitCosts {
  double forward = 1.0;
  double backward = 2.0;  // a backward computes gradients of both inputs and weights: about 2x a forward
  // Transfers take no time of their own; a receive lasts as long as its stage waits for the send.
};

struct SimulationResult {
  bool completed = false;                // every stage ran its whole list
  std::vector<std::size_t> next_action;  // per stage, the first action not run (its list size if done)
  std::size_t unreceived_sends = 0;      // sends nobody received: a schedule bug even if it completes
  std::vector<std::vector<TimelineEvent>> timeline;  // per stage, one event per action that ran
};

// Runs all stages' lists together under the execution model above, with the given durations. A stage
// advances until it reaches a receive whose matching send (same kind of data, micro-batch and pair of
// stages) has not run yet; the run ends when no stage can advance. Throws std::invalid_argument for a
// transfer whose peer is not a stage, or the same message sent twice.
SimulationResult simulate_schedules(const std::vector<std::vector<Action>>& per_stage,
                                    const UnitCosts& costs = {});

// The ideal timeline of a schedule: simulate_schedules of build_all_schedules with unit costs
// (forward 1, backward 2, transfers 0). Throws std::logic_error if the schedule does not complete.
std::vector<std::vector<TimelineEvent>> simulate_timeline(PipelineSchedule schedule, int num_stages,
                                                          int num_micro_batches);

}  // namespace touchstone::pipeline
