// The scaling chart: a self-contained SVG (no fonts, scripts or external files) drawn from the table.
#include <algorithm>
#include <cmath>

#include "common/markup.h"
#include "plan/format.h"
#include "plan/scaling_plan.h"

namespace touchstone::plan {

namespace {

constexpr int kWidth = 800, kHeight = 460;
constexpr int kLeft = 90, kRight = 710, kTop = 70, kBottom = 380;  // the plot area
constexpr const char* kThroughputColour = "#1f5fa8";
constexpr const char* kEfficiencyColour = "#c0550f";
constexpr const char* kIdealColour = "#888";

}  // namespace

std::string scaling_chart_svg(const ScalingTable& table) {
  const ScalingRow& reference = table.rows[table.reference];
  double min_gpus = 1e300, max_gpus = 0, max_tps = 0;
  for (const ScalingRow& row : table.rows) {
    const auto gpus = static_cast<double>(row.run.gpus);
    min_gpus = std::min(min_gpus, gpus);
    max_gpus = std::max(max_gpus, gpus);
    max_tps = std::max({max_tps, row.tokens_per_s, reference.tokens_per_s * row.gpu_ratio});
  }
  // GPU counts on a log axis, so doubling steps are evenly spaced; half a doubling of margin each side.
  const double x_lo = std::log2(min_gpus) - 0.5, x_hi = std::log2(max_gpus) + 0.5;
  const auto x_of = [&](int64_t gpus) {
    return kLeft + (std::log2(static_cast<double>(gpus)) - x_lo) / (x_hi - x_lo) * (kRight - kLeft);
  };
  // Tokens/s from 0 to a round top with 10% headroom; efficiency 0..120% on the right.
  const markup::LinearAxis tps_axis = markup::linear_axis(max_tps * 1.1, 5, /*round_up=*/true);
  const auto y_of_tps = [&](double tps) { return kBottom - tps / tps_axis.top * (kBottom - kTop); };
  const auto y_of_eff = [&](double eff) { return kBottom - eff / 1.2 * (kBottom - kTop); };

  markup::Svg svg(kWidth, kHeight, {{"font-family", "sans-serif"}, {"font-size", 13}}, 1);
  svg.rect({{"width", "100%"}, {"height", "100%"}, {"fill", "white"}});
  svg.text(
      {{"x", kWidth / 2}, {"y", 28}, {"text-anchor", "middle"}, {"font-size", 17}, {"font-weight", "bold"}},
      "Throughput and scaling efficiency against GPUs");
  // Grid and left axis (tokens/s).
  for (const double tps : tps_axis.ticks) {
    const double y = y_of_tps(tps);
    svg.line({{"x1", kLeft}, {"y1", y}, {"x2", kRight}, {"y2", y}, {"stroke", "#e4e4e4"}});
    svg.text({{"x", kLeft - 8}, {"y", y + 4}, {"text-anchor", "end"}, {"fill", kThroughputColour}},
             short_quantity(tps));
  }
  // Right axis (efficiency).
  for (int pct = 0; pct <= 120; pct += 20) {
    svg.text({{"x", kRight + 8}, {"y", y_of_eff(pct / 100.0) + 4}, {"fill", kEfficiencyColour}},
             std::to_string(pct) + "%");
  }
  svg.rect({{"x", kLeft},
            {"y", kTop},
            {"width", kRight - kLeft},
            {"height", kBottom - kTop},
            {"fill", "none"},
            {"stroke", "#444"}});
  // X ticks at the measured GPU counts.
  for (const ScalingRow& row : table.rows) {
    const double x = x_of(row.run.gpus);
    svg.line({{"x1", x}, {"y1", kBottom}, {"x2", x}, {"y2", kBottom + 6}, {"stroke", "#444"}});
    svg.text({{"x", x}, {"y", kBottom + 22}, {"text-anchor", "middle"}}, std::to_string(row.run.gpus));
  }
  svg.text({{"x", (kLeft + kRight) / 2}, {"y", kBottom + 48}, {"text-anchor", "middle"}}, "GPUs (log scale)");
  svg.text({{"transform", "translate(24," + std::to_string((kTop + kBottom) / 2) + ") rotate(-90)"},
            {"text-anchor", "middle"},
            {"fill", kThroughputColour}},
           "non-padding tokens/s");
  svg.text({{"transform", "translate(" + std::to_string(kWidth - 20) + "," +
                              std::to_string((kTop + kBottom) / 2) + ") rotate(90)"},
            {"text-anchor", "middle"},
            {"fill", kEfficiencyColour}},
           "scaling efficiency");

  std::vector<markup::Point> ideal, measured, efficiency;
  for (const ScalingRow& row : table.rows) {
    const double x = x_of(row.run.gpus);
    ideal.push_back({x, y_of_tps(reference.tokens_per_s * row.gpu_ratio)});
    measured.push_back({x, y_of_tps(row.tokens_per_s)});
    efficiency.push_back({x, y_of_eff(row.efficiency)});
  }
  svg.polyline({{"points", svg.points(ideal)},
                {"fill", "none"},
                {"stroke", kIdealColour},
                {"stroke-dasharray", "6 4"}});
  svg.polyline({{"points", svg.points(measured)},
                {"fill", "none"},
                {"stroke", kThroughputColour},
                {"stroke-width", 2.5}});
  svg.polyline({{"points", svg.points(efficiency)},
                {"fill", "none"},
                {"stroke", kEfficiencyColour},
                {"stroke-width", 2}});
  for (const ScalingRow& row : table.rows) {
    const double x = x_of(row.run.gpus);
    const double yt = y_of_tps(row.tokens_per_s), ye = y_of_eff(row.efficiency);
    svg.circle({{"cx", x}, {"cy", yt}, {"r", 4.5}, {"fill", kThroughputColour}});
    svg.text({{"x", x - 8}, {"y", yt - 10}, {"text-anchor", "end"}, {"fill", kThroughputColour}},
             short_quantity(row.tokens_per_s));
    svg.rect({{"x", x - 4}, {"y", ye - 4}, {"width", 8}, {"height", 8}, {"fill", kEfficiencyColour}});
    svg.text({{"x", x + 8}, {"y", ye - 8}, {"fill", kEfficiencyColour}}, percent(row.efficiency, 0));
  }
  // Legend: three line samples along the top, each a short line in its series' style and a label.
  struct LegendEntry {
    int x;
    std::string label;
    markup::Attribute style;  // the line's dash or width
    const char* colour;
  };
  const int ly = 50;
  const LegendEntry legend[] = {{kLeft, "measured tokens/s", {"stroke-width", 2.5}, kThroughputColour},
                                {kLeft + 180,
                                 "linear scaling from " + std::to_string(reference.run.gpus) + " GPUs",
                                 {"stroke-dasharray", "6 4"},
                                 kIdealColour},
                                {kLeft + 420, "scaling efficiency", {"stroke-width", 2}, kEfficiencyColour}};
  for (const LegendEntry& entry : legend) {
    svg.line({{"x1", entry.x},
              {"y1", ly},
              {"x2", entry.x + 26},
              {"y2", ly},
              {"stroke", entry.colour},
              entry.style});
    svg.text({{"x", entry.x + 32}, {"y", ly + 4}}, entry.label);
  }
  return svg.str();
}

}  // namespace touchstone::plan
