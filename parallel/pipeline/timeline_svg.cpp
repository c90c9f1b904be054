// The SVG timeline of a pipeline schedule (see timeline_svg.h).
#include "parallel/pipeline/timeline_svg.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <utility>

#include "common/markup.h"
#include "parallel/pipeline/timeline.h"

namespace touchstone::pipeline {

namespace {

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
constexpr const char* kBackwardFill = "#f58518";  // a whole backward, or its input-gradient half
constexpr const char* kWeightFill = "#54a24b";    // the deferred weight-gradient half of a backward
constexpr const char* kTransferFill = "#9d9d9d";
constexpr const char* kContextTransferFill = "#b279a2";  // a context-parallel transfer inside attention
constexpr const char* kAxisColour = "#333333";

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

  // Two decimals: enough for a screen, and short, stable output.
  markup::Svg svg(width, height, {{"font-family", "sans-serif"}, {"font-size", 12}}, 2);
  svg.title(options.title);
  svg.rect({{"x", 0}, {"y", 0}, {"width", width}, {"height", height}, {"fill", "#ffffff"}});
  svg.text({{"x", kLeft}, {"y", 26}, {"font-size", 16}, {"font-weight", "bold"}}, options.title);

  // Legend, on the title's right so that it never covers a row.
  bool split_backward = false;
  int last_chunk = 0;
  for (const auto& row : rows) {
    for (const TimelineEvent& event : row) {
      split_backward = split_backward || event.kind == ActionKind::kBackwardInput ||
                       event.kind == ActionKind::kBackwardWeight;
      last_chunk = std::max(last_chunk, event.chunk);
    }
  }
  std::vector<std::pair<const char*, std::string>> legend = {
      {kForwardFill, "forward"}, {kBackwardFill, split_backward ? "backward, input gradients" : "backward"}};
  if (split_backward) legend.emplace_back(kWeightFill, "backward, weight gradients");
  if (options.include_communication) legend.emplace_back(kTransferFill, "transfer (receive: waiting)");
  // Context-parallel transfers happen inside attention, so they are drawn as strips along the foot of the
  // forward or backward they belong to, whether or not the pipeline's transfers are drawn.
  std::vector<const TimelineEvent*> context_transfers;
  for (const TimelineEvent& event : events) {
    if (event.kind == ActionKind::kContextTransfer) context_transfers.push_back(&event);
  }
  if (!context_transfers.empty()) {
    legend.emplace_back(kContextTransferFill, "context-parallel transfer (within attention)");
  }
  if (last_chunk > 0) legend.emplace_back(kForwardFill, "lighter: later model chunks");
  double legend_x = kLeft;
  for (const auto& [fill, label] : legend) {
    svg.rect(
        {{"class", "legend"}, {"x", legend_x}, {"y", 40}, {"width", 14}, {"height", 14}, {"fill", fill}});
    svg.text({{"x", legend_x + 20.0}, {"y", 51}}, label);
    legend_x += 40.0 + 7.0 * static_cast<double>(label.size());
  }

  // Time axis with grid lines under the boxes, its ticks at round steps in the printed unit.
  const markup::LinearAxis axis = markup::linear_axis(span * scale, 8);
  const double axis_y = kPlotTop + plot_height + 6.0;
  svg.group({{"stroke", "#dddddd"}, {"stroke-width", 1}});
  for (const double tick : axis.ticks) {
    const double x = x_of(tick / scale);
    svg.line({{"x1", x}, {"y1", kPlotTop - 4.0}, {"x2", x}, {"y2", axis_y + 4.0}});
  }
  svg.end_group();
  svg.line({{"x1", kLeft},
            {"y1", axis_y},
            {"x2", kLeft + kPlotWidth},
            {"y2", axis_y},
            {"stroke", kAxisColour},
            {"stroke-width", 1}});
  svg.group({{"text-anchor", "middle"}, {"fill", kAxisColour}});
  for (const double tick : axis.ticks)
    svg.text({{"x", x_of(tick / scale)}, {"y", axis_y + 18.0}}, markup::significant(tick, 6));
  svg.text({{"x", kLeft + kPlotWidth / 2.0}, {"y", axis_y + 38.0}}, "time (" + unit + ")");
  svg.end_group();

  for (std::size_t stage = 0; stage < rows.size(); ++stage) {
    const double top = row_top(stage);
    svg.text({{"x", kLeft - 10.0}, {"y", top + kRowHeight / 2.0 + 4.0}, {"text-anchor", "end"}},
             "stage " + std::to_string(stage));
    for (const TimelineEvent& event : rows[stage]) {
      if (event.kind == ActionKind::kContextTransfer) continue;  // drawn below, over the computations
      const bool computation = is_computation(event.kind);
      const bool forward = event.kind == ActionKind::kForward;
      const char* fill = !computation                                ? kTransferFill
                         : forward                                   ? kForwardFill
                         : event.kind == ActionKind::kBackwardWeight ? kWeightFill
                                                                     : kBackwardFill;
      // Each model chunk in its own shade: chunk 0 opaque, the last chunk at half opacity.
      const double opacity =
          1.0 - 0.5 * static_cast<double>(event.chunk) / static_cast<double>(std::max(last_chunk, 1));
      const double x = x_of(event.start_seconds);
      // A box stays visible however short the event, so that none silently disappears.
      const double w = std::max(x_of(event.end_seconds) - x, 1.0);
      const std::string tooltip = action_token(event.kind, event.micro_batch, event.chunk) + " on stage " +
                                  std::to_string(stage) + ": " +
                                  markup::significant(event.start_seconds * scale, 6) + " to " +
                                  markup::significant(event.end_seconds * scale, 6) + " " + unit;
      const char* css_class = !computation                                ? "transfer"
                              : forward                                   ? "event forward"
                              : event.kind == ActionKind::kBackwardWeight ? "event weight"
                                                                          : "event backward";
      svg.rect({{"class", css_class},
                {"x", x},
                {"y", computation ? top : top + kRowHeight - kTransferHeight},
                {"width", w},
                {"height", computation ? box_height : kTransferHeight},
                {"fill", fill},
                {"fill-opacity", markup::significant(opacity, 3)},
                {"stroke", "#ffffff"},
                {"stroke-width", 1}},
               tooltip);
      const std::string number = std::to_string(event.micro_batch);
      if (computation && w >= kDigitWidth * static_cast<double>(number.size()) + 4.0) {
        svg.text({{"x", x + w / 2.0},
                  {"y", top + box_height / 2.0 + 4.0},
                  {"text-anchor", "middle"},
                  {"fill", forward ? "#ffffff" : "#000000"}},
                 number);
      }
    }
  }
  for (const TimelineEvent* event : context_transfers) {
    const double x = x_of(event->start_seconds);
    const double w = std::max(x_of(event->end_seconds) - x, 1.0);
    svg.rect({{"class", "context-transfer"},
              {"x", x},
              {"y", row_top(static_cast<std::size_t>(event->stage)) + box_height - kTransferHeight},
              {"width", w},
              {"height", kTransferHeight},
              {"fill", kContextTransferFill}},
             action_token(event->kind, event->micro_batch, event->chunk) + " on stage " +
                 std::to_string(event->stage) + ": context-parallel transfer within attention, " +
                 markup::significant(event->start_seconds * scale, 6) + " to " +
                 markup::significant(event->end_seconds * scale, 6) + " " + unit);
  }
  return svg.str();
}

}  // namespace touchstone::pipeline
