// The record of what a pipeline stage actually ran, and the text timelines drawn from it. The SVG
// drawing lives in timeline_svg.h, which this header includes, so one include gives every renderer.
//
// Each process records its own stage's events with a TimelineRecorder; the trainer gathers every
// stage's events to one rank (encode_events / decode_events make that a gather of doubles) and renders
// them there. The same renderers draw the unit-time simulation of a schedule (schedule.h), so the
// measured and the ideal timelines of one schedule can be put side by side.
//
// Token language shared by the text renderers and format_actions (schedule.h), one token per action:
//   F3   forward of micro-batch 3        B3   backward of micro-batch 3
//   RA3  receive its activation          SA3  send its activation (to the next stage)
//   RG3  receive its gradient            SG3  send its gradient (to the previous stage)
//   I3   input-gradient half of B3       W3   weight-gradient half of B3 (zero-bubble schedules split
//                                             the backward: I3 sends its gradient on at once, W3 can wait)
//   CP3  a context-parallel transfer inside the attention of micro-batch 3's forward or backward
// With virtual stages (interleaved schedules) a token of model chunk c > 0 ends in ":c", so "F3:1" is
// the forward of micro-batch 3 through the stage's second chunk; chunk 0 keeps the plain token.
// The peer of a transfer is implied by the direction: activations go to stage + 1, gradients to
// stage - 1, so the record does not need to carry it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallel/pipeline/timeline_svg.h"

namespace touchstone::pipeline {

// Defined here rather than in schedule.h so that the record (and its renderers) does not depend on
// the planner; schedule.h includes this header, so its users see ActionKind too.
// The order is the gather encoding's (encode_events): new kinds go at the end.
enum class ActionKind {
  kForward,
  kBackward,  // input and weight gradients in one pass
  kSendActivation,
  kRecvActivation,
  kSendGradient,
  kRecvGradient,
  kBackwardInput,   // the input-gradient half of a backward ("B" of the zero-bubble paper)
  kBackwardWeight,  // the weight-gradient half ("W"), which needs the activations kBackwardInput kept
  // A context-parallel transfer inside attention ("CP"): a ring step's wait for the next K/V block (or
  // dK/dV accumulator), the all-gather of K and V, the reduce-scatter of dK and dV, or the wait for the
  // ring's sends. Recorded within the forward or backward it serves (TimelineRecorder::begin_within).
  kContextTransfer,
};

bool is_computation(ActionKind kind);  // forward, backward or one of its halves
// "F3", "RG0", "F3:1", ... (see above).
std::string action_token(ActionKind kind, int micro_batch, int chunk = 0);

struct TimelineEvent {
  int stage = 0;
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;
  double start_seconds = 0.0;  // relative to the recorder's origin (or unit time steps when simulated)
  double end_seconds = 0.0;
  int chunk = 0;  // the model chunk (virtual stage) of the stage the event ran on; 0 without any
};

// Records one stage's events on a monotonic clock. Not thread-safe: one recorder per process.
class TimelineRecorder {
 public:
  using Clock = std::function<double()>;  // seconds on a monotonic clock; any fixed offset

  explicit TimelineRecorder(int stage);  // std::chrono::steady_clock
  TimelineRecorder(int stage, Clock clock);

  // Times are measured from here on (also done at construction). Every stage should call it right
  // after the same barrier, so that the stages' timelines line up when they are drawn together.
  void reset_origin();

  // One event at a time: begin() while one is open, or end() with none open, throws std::logic_error,
  // because a nested or unterminated event would make the drawn timeline lie.
  void begin(ActionKind kind, int micro_batch, int chunk = 0);
  void end();
  bool open() const { return open_; }

  // A transfer inside the open event (kContextTransfer): it takes that event's micro-batch and chunk and
  // is recorded when it ends. Throws std::logic_error when no event is open or a transfer is open.
  void begin_within(ActionKind kind);
  void end_within();

  // Begins an event and ends it when it goes out of scope, also when the computation throws. A null
  // recorder records nothing, so that an executor can be run with recording switched off:
  //   TimelineRecorder::Scope event(recorder, action.kind, action.micro_batch);
  class Scope {
   public:
    Scope(TimelineRecorder* recorder, ActionKind kind, int micro_batch, int chunk = 0);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    TimelineRecorder* recorder_;
  };
  [[nodiscard]] Scope scope(ActionKind kind, int micro_batch, int chunk = 0);

  int stage() const { return stage_; }
  const std::vector<TimelineEvent>& events() const { return events_; }
  std::vector<TimelineEvent> take_events();  // returns the events and starts an empty record

 private:
  double now() const;

  int stage_;
  Clock clock_;
  double origin_ = 0.0;
  bool open_ = false, within_open_ = false;
  TimelineEvent current_, within_;
  std::vector<TimelineEvent> events_;
};

// Six doubles per event (stage, kind, micro-batch, start, end, chunk), so that the events of every stage
// can be gathered with one MPI_Gatherv of MPI_DOUBLE; the integers are exact in a double.
std::vector<double> encode_events(const std::vector<TimelineEvent>& events);
std::vector<TimelineEvent> decode_events(const std::vector<double>& values);  // throws std::invalid_argument

// All stages' events in one list, stage by stage (the renderers take a gathered list).
std::vector<TimelineEvent> flatten_timeline(const std::vector<std::vector<TimelineEvent>>& per_stage);

// What the renderers draw: per stage, its events in order of start time (stable, so ties keep the
// order of `events`), computations only unless include_communication. Throws std::invalid_argument
// for an event whose stage is outside [0, num_stages) or that ends before it starts.
std::vector<std::vector<TimelineEvent>> events_by_stage(const std::vector<TimelineEvent>& events,
                                                        int num_stages, bool include_communication);

// Per stage, its tokens in order of start time (ties keep the order of `events`, which is the order
// they were recorded in), separated by single spaces. Computations only, unless include_communication.
// Throws std::invalid_argument for an event whose stage is outside [0, num_stages).
std::vector<std::string> render_order(const std::vector<TimelineEvent>& events, int num_stages,
                                      bool include_communication = false);

// The pipeline's idle time, measured: `span_seconds` from the first computation's start to the last
// one's end over all stages, and per stage the share of it spent in no computation (waiting for a
// peer, or in transfers). Equal stages give the bubble of the schedule: (p - 1) / (m + p - 1) for 1F1B
// and AFAB with backward = 2 forwards, (p - 1) / (3m + p - 1) for ZB-H1 with F = I = W. Throws as
// events_by_stage; an empty record has span 0 and idle 0.
struct PipelineIdle {
  double span_seconds = 0.0;
  std::vector<double> idle_share;  // per stage, in [0, 1]
};
PipelineIdle measure_idle(const std::vector<TimelineEvent>& events, int num_stages);
// "pipeline idle: stage 0 21.4%, stage 1 20.9% of 0.532 s\n"
std::string format_idle(const PipelineIdle& idle);

// One line per stage, "stage 0: F0 F1 B0 B1\n", from render_order.
std::string render_timeline_text(const std::vector<TimelineEvent>& events, int num_stages,
                                 bool include_communication = false);

}  // namespace touchstone::pipeline
