// The SVG drawing of a pipeline timeline (timeline.h): one row per stage, a box per forward and
// backward, on a time axis. timeline.h includes this header, so its users see the renderer too.
#pragma once

#include <string>
#include <vector>

namespace touchstone::pipeline {

struct TimelineEvent;  // timeline.h

struct SvgOptions {
  std::string title = "Pipeline timeline";
  // "s" for measured times (the axis switches to ms or us for short runs); anything else is printed
  // as is, e.g. "units" for the unit-time simulation.
  std::string time_unit = "s";
  // Draws transfers as thin grey bars under the row; a blocking receive's bar shows how long the
  // stage waited for its peer.
  bool include_communication = false;
};

// A self-contained SVG (no scripts, no external fonts or images): one row per stage, a box per
// forward and backward (or backward half: input gradients in the backward colour, weight gradients
// in their own) with its micro-batch number inside when it fits (and a <title> tooltip always), each
// model chunk of an interleaved schedule in a lighter shade than the one before, a time axis, the
// title and a legend. Every event box has class "event". Throws
// std::invalid_argument as events_by_stage (timeline.h) does.
std::string render_timeline_svg(const std::vector<TimelineEvent>& events, int num_stages,
                                const SvgOptions& options = {});

}  // namespace touchstone::pipeline
