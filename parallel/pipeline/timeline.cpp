// The timeline recorder, the gather encoding and the text renderers (see timeline.h).
#include "parallel/pipeline/timeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <utility>

namespace touchstone::pipeline {

bool is_computation(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight;
}

std::string action_token(ActionKind kind, int micro_batch, int chunk) {
  const char* prefix = "";
  switch (kind) {
    case ActionKind::kForward:
      prefix = "F";
      break;
    case ActionKind::kBackward:
      prefix = "B";
      break;
    case ActionKind::kSendActivation:
      prefix = "SA";
      break;
    case ActionKind::kRecvActivation:
      prefix = "RA";
      break;
    case ActionKind::kSendGradient:
      prefix = "SG";
      break;
    case ActionKind::kRecvGradient:
      prefix = "RG";
      break;
    case ActionKind::kBackwardInput:
      prefix = "I";
      break;
    case ActionKind::kBackwardWeight:
      prefix = "W";
      break;
    case ActionKind::kContextTransfer:
      prefix = "CP";
      break;
  }
  return prefix + std::to_string(micro_batch) + (chunk != 0 ? ":" + std::to_string(chunk) : "");
}

// ---- Recorder ----

TimelineRecorder::TimelineRecorder(int stage)
    : TimelineRecorder(stage, [] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      }) {}

TimelineRecorder::TimelineRecorder(int stage, Clock clock) : stage_(stage), clock_(std::move(clock)) {
  reset_origin();
}

void TimelineRecorder::reset_origin() { origin_ = clock_(); }

double TimelineRecorder::now() const { return clock_() - origin_; }

void TimelineRecorder::begin(ActionKind kind, int micro_batch, int chunk) {
  if (open_) {
    throw std::logic_error("timeline: begin " + action_token(kind, micro_batch, chunk) + " while " +
                           action_token(current_.kind, current_.micro_batch, current_.chunk) +
                           " is still open");
  }
  current_ = {stage_, kind, micro_batch, now(), 0.0, chunk};
  open_ = true;
}

void TimelineRecorder::end() {
  if (!open_) throw std::logic_error("timeline: end without a matching begin");
  if (within_open_) throw std::logic_error("timeline: end while a transfer within it is open");
  current_.end_seconds = now();
  events_.push_back(current_);
  open_ = false;
}

void TimelineRecorder::begin_within(ActionKind kind) {
  if (!open_ || within_open_) {
    throw std::logic_error(std::string("timeline: a transfer within ") +
                           (open_ ? "a transfer" : "no open event"));
  }
  within_ = {stage_, kind, current_.micro_batch, now(), 0.0, current_.chunk};
  within_open_ = true;
}

void TimelineRecorder::end_within() {
  if (!within_open_) throw std::logic_error("timeline: end_within without a matching begin_within");
  within_.end_seconds = now();
  events_.push_back(within_);
  within_open_ = false;
}

TimelineRecorder::Scope::Scope(TimelineRecorder* recorder, ActionKind kind, int micro_batch, int chunk)
    : recorder_(recorder) {
  if (recorder_ != nullptr) recorder_->begin(kind, micro_batch, chunk);
}

TimelineRecorder::Scope::~Scope() {
  // end() was already called by hand if nothing is open; a destructor must not throw for that.
  if (recorder_ != nullptr && recorder_->open_) recorder_->end();
}

TimelineRecorder::Scope TimelineRecorder::scope(ActionKind kind, int micro_batch, int chunk) {
  return Scope(this, kind, micro_batch, chunk);
}

std::vector<TimelineEvent> TimelineRecorder::take_events() { return std::exchange(events_, {}); }

// ---- Gather encoding ----

namespace {
constexpr std::size_t kValuesPerEvent = 6;
constexpr int kLastKind = static_cast<int>(ActionKind::kContextTransfer);
}  // namespace

std::vector<double> encode_events(const std::vector<TimelineEvent>& events) {
  std::vector<double> values;
  values.reserve(events.size() * kValuesPerEvent);
  for (const TimelineEvent& event : events) {
    values.insert(values.end(), {static_cast<double>(event.stage), static_cast<double>(event.kind),
                                 static_cast<double>(event.micro_batch), event.start_seconds,
                                 event.end_seconds, static_cast<double>(event.chunk)});
  }
  return values;
}

std::vector<TimelineEvent> decode_events(const std::vector<double>& values) {
  if (values.size() % kValuesPerEvent != 0) {
    throw std::invalid_argument("timeline: " + std::to_string(values.size()) +
                                " encoded values are not a whole number of events");
  }
  std::vector<TimelineEvent> events;
  for (std::size_t i = 0; i < values.size(); i += kValuesPerEvent) {
    // Stage, kind, micro-batch and chunk travel as doubles; each must be a whole number an int holds
    // before it is converted (a cast of anything else is undefined).
    const auto whole = [&](std::size_t field, const char* name, double largest) {
      const double value = values[i + field];
      if (!(value >= 0 && value <= largest) || value != std::floor(value)) {
        throw std::invalid_argument("timeline: encoded event " + std::to_string(i / kValuesPerEvent) +
                                    " has no valid " + name);
      }
      return static_cast<int>(value);
    };
    constexpr double kLargestInt = std::numeric_limits<int>::max();
    const int stage = whole(0, "stage", kLargestInt);
    const int kind = whole(1, "action kind", kLastKind);
    const int micro_batch = whole(2, "micro-batch", kLargestInt);
    const int chunk = whole(5, "chunk", kLargestInt);
    events.push_back(
        {stage, static_cast<ActionKind>(kind), micro_batch, values[i + 3], values[i + 4], chunk});
  }
  return events;
}

std::vector<TimelineEvent> flatten_timeline(const std::vector<std::vector<TimelineEvent>>& per_stage) {
  std::vector<TimelineEvent> events;
  for (const auto& stage_events : per_stage)
    events.insert(events.end(), stage_events.begin(), stage_events.end());
  return events;
}

// ---- Rows to draw, and the text ----

std::vector<std::vector<TimelineEvent>> events_by_stage(const std::vector<TimelineEvent>& events,
                                                        int num_stages, bool include_communication) {
  if (num_stages < 1) {
    throw std::invalid_argument("timeline: num_stages must be >= 1, got " + std::to_string(num_stages));
  }
  std::vector<std::vector<TimelineEvent>> rows(static_cast<std::size_t>(num_stages));
  for (const TimelineEvent& event : events) {
    if (event.stage < 0 || event.stage >= num_stages) {
      throw std::invalid_argument("timeline: event " + action_token(event.kind, event.micro_batch) +
                                  " is on stage " + std::to_string(event.stage) + ", outside [0, " +
                                  std::to_string(num_stages) + ")");
    }
    if (!(event.end_seconds >= event.start_seconds)) {
      throw std::invalid_argument("timeline: event " + action_token(event.kind, event.micro_batch) +
                                  " on stage " + std::to_string(event.stage) + " ends before it starts");
    }
    if (include_communication || is_computation(event.kind)) {
      rows[static_cast<std::size_t>(event.stage)].push_back(event);
    }
  }
  for (auto& row : rows) {
    std::stable_sort(row.begin(), row.end(), [](const TimelineEvent& a, const TimelineEvent& b) {
      return a.start_seconds < b.start_seconds;
    });
  }
  return rows;
}

std::vector<std::string> render_order(const std::vector<TimelineEvent>& events, int num_stages,
                                      bool include_communication) {
  std::vector<std::string> orders;
  for (const auto& row : events_by_stage(events, num_stages, include_communication)) {
    std::string order;
    for (const TimelineEvent& event : row) {
      if (!order.empty()) order += ' ';
      order += action_token(event.kind, event.micro_batch, event.chunk);
    }
    orders.push_back(std::move(order));
  }
  return orders;
}

PipelineIdle measure_idle(const std::vector<TimelineEvent>& events, int num_stages) {
  const std::vector<std::vector<TimelineEvent>> rows = events_by_stage(events, num_stages, false);
  double first = 0.0, last = 0.0;
  bool any = false;
  std::vector<double> busy(rows.size(), 0.0);
  for (std::size_t stage = 0; stage < rows.size(); ++stage) {
    for (const TimelineEvent& event : rows[stage]) {
      first = any ? std::min(first, event.start_seconds) : event.start_seconds;
      last = any ? std::max(last, event.end_seconds) : event.end_seconds;
      any = true;
      busy[stage] += event.end_seconds - event.start_seconds;
    }
  }
  PipelineIdle idle;
  idle.span_seconds = last - first;
  for (const double seconds : busy) {
    idle.idle_share.push_back(
        idle.span_seconds > 0.0 ? std::clamp(1.0 - seconds / idle.span_seconds, 0.0, 1.0) : 0.0);
  }
  return idle;
}

std::string format_idle(const PipelineIdle& idle) {
  std::string text = "pipeline idle:";
  for (std::size_t stage = 0; stage < idle.idle_share.size(); ++stage) {
    char share[64];
    std::snprintf(share, sizeof share, "%s stage %zu %.1f%%", stage == 0 ? "" : ",", stage,
                  100.0 * idle.idle_share[stage]);
    text += share;
  }
  char span[64];
  std::snprintf(span, sizeof span, " of %.3f s\n", idle.span_seconds);
  return text + span;
}

std::string render_timeline_text(const std::vector<TimelineEvent>& events, int num_stages,
                                 bool include_communication) {
  const std::vector<std::string> orders = render_order(events, num_stages, include_communication);
  std::string text;
  for (std::size_t stage = 0; stage < orders.size(); ++stage) {
    text += "stage " + std::to_string(stage) + ":";
    if (!orders[stage].empty()) text += " " + orders[stage];
    text += "\n";
  }
  return text;
}

}  // namespace touchstone::pipeline
