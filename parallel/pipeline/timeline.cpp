// The timeline recorder, the gather encoding and the text and SVG renderers (see timeline.h).
#include "parallel/pipeline/timeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "common/text_output.h"

namespace touchstone::pipeline {

bool is_computation(ActionKind kind) { return kind == ActionKind::kForward || kind == ActionKind::kBackward; }

std::string action_token(ActionKind kind, int micro_batch) {
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
  }
  return prefix + std::to_string(micro_batch);
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

void TimelineRecorder::begin(ActionKind kind, int micro_batch) {
  if (open_) {
    throw std::logic_error("timeline: begin " + action_token(kind, micro_batch) + " while " +
                           action_token(current_.kind, current_.micro_batch) + " is still open");
  }
  current_ = {stage_, kind, micro_batch, now(), 0.0};
  open_ = true;
}

void TimelineRecorder::end() {
  if (!open_) throw std::logic_error("timeline: end without a matching begin");
  current_.end_seconds = now();
  events_.push_back(current_);
  open_ = false;
}

TimelineRecorder::Scope::Scope(TimelineRecorder* recorder, ActionKind kind, int micro_batch)
    : recorder_(recorder) {
  if (recorder_ != nullptr) recorder_->begin(kind, micro_batch);
}

TimelineRecorder::Scope::~Scope() {
  // end() was already called by hand if nothing is open; a destructor must not throw for that.
  if (recorder_ != nullptr && recorder_->open_) recorder_->end();
}

TimelineRecorder::Scope TimelineRecorder::scope(ActionKind kind, int micro_batch) {
  return Scope(this, kind, micro_batch);
}

std::vector<TimelineEvent> TimelineRecorder::take_events() { return std::exchange(events_, {}); }

// ---- Gather encoding ----

namespace {
constexpr std::size_t kValuesPerEvent = 5;
constexpr int kLastKind = static_cast<int>(ActionKind::kRecvGradient);
}  // namespace

std::vector<double> encode_events(const std::vector<TimelineEvent>& events) {
  std::vector<double> values;
  values.reserve(events.size() * kValuesPerEvent);
  for (const TimelineEvent& event : events) {
    values.insert(values.end(),
                  {static_cast<double>(event.stage), static_cast<double>(event.kind),
                   static_cast<double>(event.micro_batch), event.start_seconds, event.end_seconds});
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
    const double kind = values[i + 1];
    if (!(kind >= 0 && kind <= kLastKind) || kind != std::floor(kind)) {
      throw std::invalid_argument("timeline: encoded event " + std::to_string(i / kValuesPerEvent) +
                                  " has no valid action kind");
    }
    events.push_back({static_cast<int>(values[i]), static_cast<ActionKind>(static_cast<int>(kind)),
                      static_cast<int>(values[i + 2]), values[i + 3], values[i + 4]});
  }
  return events;
}

std::vector<TimelineEvent> flatten_timeline(const std::vector<std::vector<TimelineEvent>>& per_stage) {
  std::vector<TimelineEvent> events;
  for (const auto& stage_events : per_stage)
    events.insert(events.end(), stage_events.begin(), stage_events.end());
  return events;
}

// ---- Text ----

namespace {

// Each stage's events to draw, in order of start time; stable, so ties keep the recorded order.
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

}  // namespace

std::vector<std::string> render_order(const std::vector<TimelineEvent>& events, int num_stages,
                                      bool include_communication) {
  std::vector<std::string> orders;
  for (const auto& row : events_by_stage(events, num_stages, include_communication)) {
    std::string order;
    for (const TimelineEvent& event : row) {
      if (!order.empty()) order += ' ';
      order += action_token(event.kind, event.micro_batch);
    }
    orders.push_back(std::move(order));
  }
  return orders;
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

// ---- SVG ----

namespace {

// Coordinates with two decimals: enough for a screen, and short, stable output.
std::string px(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f", value);
  return buffer;
}

// A time in axis units without trailing zeros ("0.25", "30").
std::string time_label(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.6g", value);
  return buffer;
}

constexpr double kLeft = 80.0;  // room for the stage labels
constexpr double kPlotWidth = 960.0;
constexpr double kRight = 24.0;
constexpr double kPlotTop = 70.0;  // below the title and the legend
constexpr double kRowHeight = 30.0;
constexpr double kRowGap = 10.0;
constexpr double kTransferHeight = 5.0;
constexpr double kAxisHeight = 50.0;
constexpr double kDigitWidth = 7.5;  // of a 12 px sans-serif digit, generously
constexpr const char* kForwardFill = "#4c78a8";
constexpr const char* kBackwardFill = "#f58518";
constexpr const char* kTransferFill = "#9d9d9d";

}  // namespace

std::string render_timeline_svg(const std::vector<TimelineEvent>& events, int num_stages,
                                const SvgOptions& options) {
  const auto rows = events_by_stage(events, num_stages, options.include_communication);

  double span = 0.0;
  for (const auto& row : rows) {
    for (const TimelineEvent& event : row) span = std::max(span, event.end_seconds);
  }
  if (!(span > 0.0)) span = 1.0;

  // Measured runs are usually far shorter than a second; print them in a unit that gives short labels.
  double scale = 1.0;
  std::string unit = options.time_unit;
  if (options.time_unit == "s" && span < 1e-3) {
    scale = 1e6;
    unit = "us";
  } else if (options.time_unit == "s" && span < 1.0) {
    scale = 1e3;
    unit = "ms";
  }

  const double box_height = options.include_communication ? kRowHeight - kTransferHeight - 2.0 : kRowHeight;
  const double plot_height = num_stages * (kRowHeight + kRowGap) - kRowGap;
  const double width = kLeft + kPlotWidth + kRight;
  const double height = kPlotTop + plot_height + kAxisHeight;
  auto x_of = [&](double seconds) { return kLeft + seconds / span * kPlotWidth; };
  auto row_top = [&](std::size_t stage) {
    return kPlotTop + static_cast<double>(stage) * (kRowHeight + kRowGap);
  };

  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" +
                    px(height) + "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
                    "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<title>" + xml_escape(options.title) + "</title>\n";
  svg +=
      "<rect x=\"0\" y=\"0\" width=\"" + px(width) + "\" height=\"" + px(height) + "\" fill=\"#ffffff\"/>\n";
  svg += "<text x=\"" + px(kLeft) + "\" y=\"26\" font-size=\"16\" font-weight=\"bold\">" +
         xml_escape(options.title) + "</text>\n";

  // Legend, on the title's right so that it never covers a row.
  std::vector<std::pair<const char*, const char*>> legend = {{kForwardFill, "forward"},
                                                             {kBackwardFill, "backward"}};
  if (options.include_communication) legend.push_back({kTransferFill, "transfer (receive: waiting)"});
  double legend_x = kLeft;
  for (const auto& [fill, label] : legend) {
    svg += "<rect class=\"legend\" x=\"" + px(legend_x) + "\" y=\"40\" width=\"14\" height=\"14\" fill=\"" +
           fill + "\"/>\n<text x=\"" + px(legend_x + 20.0) + "\" y=\"51\">" + label + "</text>\n";
    legend_x += 40.0 + 7.0 * static_cast<double>(std::string(label).size());
  }

  // Time axis with grid lines under the boxes.
  const double step = round_tick_step(span * scale, 8) / scale;
  const double axis_y = kPlotTop + plot_height + 6.0;
  svg += "<g stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double t = 0.0; t <= span * (1.0 + 1e-9); t += step) {
    svg += "<line x1=\"" + px(x_of(t)) + "\" y1=\"" + px(kPlotTop - 4.0) + "\" x2=\"" + px(x_of(t)) +
           "\" y2=\"" + px(axis_y + 4.0) + "\"/>\n";
  }
  svg += "</g>\n<line x1=\"" + px(kLeft) + "\" y1=\"" + px(axis_y) + "\" x2=\"" + px(kLeft + kPlotWidth) +
         "\" y2=\"" + px(axis_y) + "\" stroke=\"#333333\" stroke-width=\"1\"/>\n";
  svg += "<g text-anchor=\"middle\" fill=\"#333333\">\n";
  for (double t = 0.0; t <= span * (1.0 + 1e-9); t += step) {
    svg += "<text x=\"" + px(x_of(t)) + "\" y=\"" + px(axis_y + 18.0) + "\">" + time_label(t * scale) +
           "</text>\n";
  }
  svg += "<text x=\"" + px(kLeft + kPlotWidth / 2.0) + "\" y=\"" + px(axis_y + 38.0) + "\">time (" +
         xml_escape(unit) + ")</text>\n</g>\n";

  for (std::size_t stage = 0; stage < rows.size(); ++stage) {
    const double top = row_top(stage);
    svg += "<text x=\"" + px(kLeft - 10.0) + "\" y=\"" + px(top + kRowHeight / 2.0 + 4.0) +
           "\" text-anchor=\"end\">stage " + std::to_string(stage) + "</text>\n";
    for (const TimelineEvent& event : rows[stage]) {
      const bool computation = is_computation(event.kind);
      const bool forward = event.kind == ActionKind::kForward;
      const double x = x_of(event.start_seconds);
      // A box stays visible however short the event, so that none silently disappears.
      const double w = std::max(x_of(event.end_seconds) - x, 1.0);
      const double y = computation ? top : top + kRowHeight - kTransferHeight;
      const std::string token = action_token(event.kind, event.micro_batch);
      const std::string tooltip = token + " on stage " + std::to_string(stage) + ": " +
                                  time_label(event.start_seconds * scale) + " to " +
                                  time_label(event.end_seconds * scale) + " " + unit;
      const char* css = computation ? (forward ? "event forward" : "event backward") : "transfer";
      const char* fill = computation ? (forward ? kForwardFill : kBackwardFill) : kTransferFill;
      svg += "<rect class=\"" + std::string(css) + "\" x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" +
             px(w) + "\" height=\"" + px(computation ? box_height : kTransferHeight) + "\" fill=\"" + fill +
             "\" stroke=\"#ffffff\" stroke-width=\"1\"><title>" + xml_escape(tooltip) + "</title></rect>\n";
      const std::string number = std::to_string(event.micro_batch);
      if (computation && w >= kDigitWidth * static_cast<double>(number.size()) + 4.0) {
        svg += "<text x=\"" + px(x + w / 2.0) + "\" y=\"" + px(top + box_height / 2.0 + 4.0) +
               "\" text-anchor=\"middle\" fill=\"" + (forward ? "#ffffff" : "#000000") + "\">" + number +
               "</text>\n";
      }
    }
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace touchstone::pipeline
