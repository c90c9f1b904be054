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
//   interleaved 1F1B (build_interleaved_schedule): each stage holds v model chunks, see below.
//   "zb_h1" ZB-H1 (build_zero_bubble_h1_schedule): 1F1B with the backward split in two, see below.
// Transfers around every computation:
//   forward j:  RecvActivation(j) from s - 1 (unless s == 0) before, SendActivation(j) to s + 1 (unless
//               s == p - 1) after
//   backward j: RecvGradient(j) from s + 1 (unless s == p - 1) before, SendGradient(j) to s - 1 (unless
//               s == 0) after; in a split backward the input-gradient half I carries both transfers
//               and the weight-gradient half W none
// With virtual stages the neighbours are those of the virtual pipeline: model chunk c of stage s is
// virtual stage c * p + s (Megatron-LM's assignment: stage s holds chunks s, s + p, s + 2p, ...), so
// the last stage's chunk c sends its activations to the first stage's chunk c + 1.
//
// Execution model the schedules are checked against (and that the executor must honour): sends are
// non-blocking, receives block, and messages are matched by (micro-batch, direction, chunk) tags, not
// by arrival order. Blocking receives and non-blocking sends make the stages a Kahn process network,
// so whether a schedule deadlocks, and the simulated times, do not depend on how the stages interleave.
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
  int chunk = 0;        // the model chunk of this stage the action belongs to; 0 without virtual stages
  int peer_chunk = 0;   // the model chunk of peer_stage that sends or receives a transfer

  friend bool operator==(const Action&, const Action&) = default;
};

// The complete ordered list for `stage` of a parallel.schedule ("zb_h1" is build_zero_bubble_h1_schedule).
// Throws std::invalid_argument for num_stages < 1, stage outside [0, num_stages) or num_micro_batches < 1.
std::vector<Action> build_schedule(PipelineSchedule schedule, int num_stages, int stage,
                                   int num_micro_batches);

// Every stage's list, index = stage.
std::vector<std::vector<Action>> build_all_schedules(PipelineSchedule schedule, int num_stages,
                                                     int num_micro_batches);

// Interleaved 1F1B: Megatron-LM's forward_backward_pipelining_with_interleaving for v =
// virtual_stages model chunks per stage. The m micro-batches run through the chunks in groups of
// g = micro_batch_group_size (0 means p, Megatron-LM's default): forward number k of the stage takes
// (micro-batch, chunk) from the table "for each group: for each chunk c = 0..v-1: the group's
// micro-batches", backward number k the same entry with chunk v - 1 - c. Stage s warms up with
//   w = min((p - s - 1) * 2 + (v - 1) * g, v m)
// forwards, then alternates forward k + w and backward k, then runs the w backwards left. Within one
// chunk the backwards still run in ascending micro-batch order. Bubble: (p - 1) / (v m) of the ideal
// time, against (p - 1) / m for 1F1B. Throws std::invalid_argument, with Megatron-LM's reasons, when
// g is outside [p, m] or when the last group is smaller than p (m % g in (0, p)): with the default
// g = p both say m must be a multiple of p. virtual_stages = 1 is plain 1F1B, with no constraint.
std::vector<Action> build_interleaved_schedule(int num_stages, int virtual_stages, int stage,
                                               int num_micro_batches, int micro_batch_group_size = 0);

// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 3.1): 1F1B whose backward is
// split into I (input gradients, sent to the previous stage at once) and W (weight gradients, which
// only this stage needs and which can wait). Stage s warms up with the forwards of 1F1B, runs
// "F, I" pairs in the steady state and the I's of the cool-down, and after each I runs the oldest W
// still pending while more than s are: the last stage defers the most W's, into the time it would
// wait for gradients in 1F1B, and the first none. The W's still pending run at the end. Every stage
// then holds at most p micro-batches' activations, the peak of 1F1B's first stage, and with
// F = I = W the bubble is (p - 1)(F + I - W) instead of 1F1B's (p - 1)(F + I + W). Throws as
// build_schedule does.
std::vector<Action> build_zero_bubble_h1_schedule(int num_stages, int stage, int num_micro_batches);

// Space-separated tokens (timeline.h), the expected counterpart of render_order() of a record.
std::string format_actions(const std::vector<Action>& actions, bool include_communication = false);

// The most micro-batches whose forward has run and whose backward (or, split, whose W) has not, at
// any point of the list: how many sets of activations the stage must hold at once. With virtual
// stages a set is one chunk's activations of one micro-batch.
int peak_in_flight(const std::vector<Action>& actions);

struct UnitCosts {
  double forward = 1.0;
  double backward = 2.0;  // a backward computes gradients of both inputs and weights: about 2x a forward
  double backward_input = 1.0;  // its halves, about a forward each
  double backward_weight = 1.0;
  // One action is one chunk's work: with v chunks per stage each takes 1/v of a stage's layers, and
  // scaling every cost by 1/v does not change the bubble fractions the simulation is used for.
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
// stages and chunks) has not run yet; the run ends when no stage can advance. Throws std::invalid_argument
// for a transfer whose peer is not a stage, a negative chunk, or the same message sent twice.
SimulationResult simulate_schedules(const std::vector<std::vector<Action>>& per_stage,
                                    const UnitCosts& costs = {});

// The ideal timeline of a schedule: simulate_schedules of build_all_schedules with unit costs
// (forward 1, backward 2, transfers 0). Throws std::logic_error if the schedule does not complete.
std::vector<std::vector<TimelineEvent>> simulate_timeline(PipelineSchedule schedule, int num_stages,
                                                          int num_micro_batches);

}  // namespace touchstone::pipeline
