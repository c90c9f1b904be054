// The error chart: relative L2 error (log scale) per layer, one series per tensor kind, against the
// tolerance. Layers run left to right as in the forward pass: embedding, layers 0 .. L-1, the head.
#include <algorithm>
#include <cmath>
#include <map>

#include "common/markup.h"
#include "oracle/diff/report.h"

namespace touchstone::diff {

namespace {

struct Series {
  const char* kind;
  const char* colour;
};
const Series kSeries[] = {{"embedding", "#1f77b4"}, {"input_norm", "#aec7e8"},   {"qkv", "#ff7f0e"},
                          {"proj", "#2ca02c"},      {"pre_mlp_norm", "#98df8a"}, {"fc1", "#9467bd"},
                          {"fc2", "#8c564b"},       {"final_norm", "#e377c2"},   {"output", "#17becf"}};

constexpr double kFloor = 1e-18;  // exact agreement is drawn at the bottom of the scale
constexpr double kWidth = 900, kHeight = 380, kLeft = 70, kRight = 150, kTop = 40, kBottom = 50;
constexpr const char* kToleranceColour = "#d62728";

}  // namespace

std::string error_chart_svg(const DiffResult& r, int64_t step, const std::string& group) {
  std::vector<const Entry*> points;
  for (const Entry& e : r.entries) {
    if (e.step == step && e.group == group && e.param >= 0 && e.status != Status::kNotCompared &&
        e.reason.empty()) {
      points.push_back(&e);
    }
  }
  if (points.empty()) return "";
  const int64_t L = r.num_layers;
  auto x_slot = [&](const Entry& e) {
    return e.kind == "embedding" ? 0 : (e.layer >= 0 ? e.layer + 1 : L + 1);
  };
  double lo = 1e300, hi = 0;
  std::map<int64_t, double> tolerance;  // x slot -> the largest tolerance there
  for (const Entry* e : points) {
    const double v = std::max(e->metrics.relative_l2, kFloor);
    lo = std::min({lo, v, e->tolerance.relative_l2 > 0 ? e->tolerance.relative_l2 : v});
    hi = std::max({hi, v, e->tolerance.relative_l2});
    tolerance[x_slot(*e)] = std::max(tolerance[x_slot(*e)], e->tolerance.relative_l2);
  }
  const double y0 = std::floor(std::log10(lo)) - 1, y1 = std::max(std::ceil(std::log10(hi)) + 1, y0 + 3);
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  const double slot_w = plot_w / static_cast<double>(L + 2);
  auto X = [&](int64_t slot) {
    return kLeft + plot_w * (static_cast<double>(slot) + 0.5) / static_cast<double>(L + 2);
  };
  auto Y = [&](double v) { return kTop + plot_h * (y1 - std::log10(std::max(v, kFloor))) / (y1 - y0); };

  markup::Svg svg(kWidth, kHeight, {{"font-family", "sans-serif"}, {"font-size", 11}}, 1);
  svg.rect({{"width", "100%"}, {"height", "100%"}, {"fill", "white"}});
  const std::string what = group == "init"    ? "the initial parameters"
                           : group == "grads" ? "the gradients of step " + std::to_string(step)
                                              : "the parameters after step " + std::to_string(step);
  svg.text({{"x", kLeft}, {"y", 22}, {"font-size", 14}, {"font-weight", "bold"}},
           "Relative L2 error of " + what + ", per layer and tensor kind");
  for (double d = y0; d <= y1 + 1e-9; d += 1) {  // a grid line and label per decade
    const double y = kTop + plot_h * (y1 - d) / (y1 - y0);
    svg.line({{"x1", kLeft}, {"x2", kLeft + plot_w}, {"y1", y}, {"y2", y}, {"stroke", "#e5e5e5"}});
    svg.text({{"x", kLeft - 6}, {"y", y + 4}, {"text-anchor", "end"}},
             "1e" + std::to_string(static_cast<int>(d)));
  }
  for (int64_t slot = 0; slot < L + 2; ++slot) {
    const std::string label =
        slot == 0 ? "embedding" : (slot == L + 1 ? "head" : "layer " + std::to_string(slot - 1));
    svg.text({{"x", X(slot)}, {"y", kTop + plot_h + 18}, {"text-anchor", "middle"}}, label);
  }
  svg.rect({{"x", kLeft},
            {"y", kTop},
            {"width", plot_w},
            {"height", plot_h},
            {"fill", "none"},
            {"stroke", "#444"}});
  const double label_y = kTop + plot_h / 2;
  svg.text({{"x", 16},
            {"y", label_y},
            {"transform", "rotate(-90 16 " + svg.number(label_y) + ")"},
            {"text-anchor", "middle"}},
           "||candidate - golden|| / ||golden||");

  // The tolerance: a dashed step line over the slots.
  std::vector<markup::Point> steps;
  for (const auto& [slot, tol] : tolerance) {
    const double left = X(slot) - slot_w / 2;
    steps.push_back({left, Y(tol)});
    steps.push_back({left + slot_w, Y(tol)});
  }
  svg.path({{"d", svg.path_through(steps)},
            {"fill", "none"},
            {"stroke", kToleranceColour},
            {"stroke-width", 1.5},
            {"stroke-dasharray", "6 4"}});

  double legend_y = kTop + 8;
  int series_index = 0;
  for (const Series& s : kSeries) {
    // Kinds are drawn side by side within a slot, so that equal errors do not hide each other.
    const double shift = (static_cast<double>(series_index++) - 4.0) * 3.0;
    std::vector<const Entry*> series;
    for (const Entry* e : points) {
      if (e->kind == s.kind) series.push_back(e);
    }
    if (series.empty()) continue;
    std::sort(series.begin(), series.end(),
              [&](const Entry* a, const Entry* b) { return x_slot(*a) < x_slot(*b); });
    auto at = [&](const Entry& e) { return markup::Point{X(x_slot(e)) + shift, Y(e.metrics.relative_l2)}; };
    std::vector<markup::Point> line;
    for (const Entry* e : series) line.push_back(at(*e));
    svg.path({{"d", svg.path_through(line)}, {"fill", "none"}, {"stroke", s.colour}, {"stroke-width", 1.5}});
    for (const Entry* e : series) {
      const markup::Point p = at(*e);
      const std::string tooltip = e->path + ": " + number(e->metrics.relative_l2);
      if (e->status == Status::kFail) {
        svg.circle({{"cx", p.x},
                    {"cy", p.y},
                    {"r", 5},
                    {"fill", s.colour},
                    {"stroke", kToleranceColour},
                    {"stroke-width", 2}},
                   tooltip + " (FAIL)");
      } else {
        svg.circle({{"cx", p.x}, {"cy", p.y}, {"r", 3.5}, {"fill", s.colour}}, tooltip);
      }
    }
    svg.circle({{"cx", kWidth - kRight + 16}, {"cy", legend_y}, {"r", 4}, {"fill", s.colour}});
    svg.text({{"x", kWidth - kRight + 26}, {"y", legend_y + 4}}, s.kind);
    legend_y += 18;
  }
  svg.line({{"x1", kWidth - kRight + 8},
            {"x2", kWidth - kRight + 24},
            {"y1", legend_y},
            {"y2", legend_y},
            {"stroke", kToleranceColour},
            {"stroke-dasharray", "4 3"},
            {"stroke-width", 1.5}});
  svg.text({{"x", kWidth - kRight + 28}, {"y", legend_y + 4}}, "tolerance");
  svg.text({{"x", kWidth - kRight + 8}, {"y", legend_y + 22}}, "ringed: FAIL");
  svg.text({{"x", kWidth - kRight + 8}, {"y", legend_y + 40}}, "0 is drawn at 1e-18");
  return svg.str();
}

}  // namespace touchstone::diff
