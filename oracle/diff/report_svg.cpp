// The error chart: relative L2 error (log scale) per layer, one series per tensor kind, against the
// tolerance. Layers run left to right as in the forward pass: embedding, layers 0 .. L-1, the head.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

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

std::string f(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", v);
  return buffer;
}

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
  auto X = [&](int64_t slot) {
    return kLeft + plot_w * (static_cast<double>(slot) + 0.5) / static_cast<double>(L + 2);
  };
  auto Y = [&](double v) { return kTop + plot_h * (y1 - std::log10(std::max(v, kFloor))) / (y1 - y0); };

  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + f(kWidth) + "\" height=\"" +
                    f(kHeight) + "\" viewBox=\"0 0 " + f(kWidth) + " " + f(kHeight) +
                    "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const std::string what = group == "init"    ? "the initial parameters"
                           : group == "grads" ? "the gradients of step " + std::to_string(step)
                                              : "the parameters after step " + std::to_string(step);
  svg += "<text x=\"" + f(kLeft) + "\" y=\"22\" font-size=\"14\" font-weight=\"bold\">Relative L2 error of " +
         what + ", per layer and tensor kind</text>\n";
  for (double d = y0; d <= y1 + 1e-9; d += 1) {  // a grid line and label per decade
    const double y = kTop + plot_h * (y1 - d) / (y1 - y0);
    svg += "<line x1=\"" + f(kLeft) + "\" x2=\"" + f(kLeft + plot_w) + "\" y1=\"" + f(y) + "\" y2=\"" + f(y) +
           "\" stroke=\"#e5e5e5\"/><text x=\"" + f(kLeft - 6) + "\" y=\"" + f(y + 4) +
           "\" text-anchor=\"end\">1e" + std::to_string(static_cast<int>(d)) + "</text>\n";
  }
  for (int64_t slot = 0; slot < L + 2; ++slot) {
    const std::string label =
        slot == 0 ? "embedding" : (slot == L + 1 ? "head" : "layer " + std::to_string(slot - 1));
    svg += "<text x=\"" + f(X(slot)) + "\" y=\"" + f(kTop + plot_h + 18) + "\" text-anchor=\"middle\">" +
           label + "</text>\n";
  }
  svg += "<rect x=\"" + f(kLeft) + "\" y=\"" + f(kTop) + "\" width=\"" + f(plot_w) + "\" height=\"" +
         f(plot_h) + "\" fill=\"none\" stroke=\"#444\"/>\n";
  svg += "<text x=\"16\" y=\"" + f(kTop + plot_h / 2) + "\" transform=\"rotate(-90 16 " +
         f(kTop + plot_h / 2) + ")\" text-anchor=\"middle\">||candidate - golden|| / ||golden||</text>\n";

  // The tolerance: a dashed step line over the slots.
  std::string path;
  for (const auto& [slot, tol] : tolerance) {
    const double left = X(slot) - plot_w / static_cast<double>(L + 2) / 2,
                 right = left + plot_w / static_cast<double>(L + 2);
    path += (path.empty() ? "M" : " L") + f(left) + " " + f(Y(tol)) + " L" + f(right) + " " + f(Y(tol));
  }
  svg += "<path d=\"" + path +
         "\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n";

  double legend_y = kTop + 8;
  int series_index = 0;
  for (const Series& s : kSeries) {
    // Kinds are drawn side by side within a slot, so that equal errors do not hide each other.
    const double shift = (static_cast<double>(series_index++) - 4.0) * 3.0;
    auto SX = [&](const Entry& e) { return X(x_slot(e)) + shift; };
    std::vector<const Entry*> series;
    for (const Entry* e : points) {
      if (e->kind == s.kind) series.push_back(e);
    }
    if (series.empty()) continue;
    std::sort(series.begin(), series.end(),
              [&](const Entry* a, const Entry* b) { return x_slot(*a) < x_slot(*b); });
    std::string line;
    for (const Entry* e : series) {
      line += (line.empty() ? "M" : " L") + f(SX(*e)) + " " + f(Y(e->metrics.relative_l2));
    }
    svg += "<path d=\"" + line + "\" fill=\"none\" stroke=\"" + s.colour + "\" stroke-width=\"1.5\"/>\n";
    for (const Entry* e : series) {
      const bool fail = e->status == Status::kFail;
      svg += "<circle cx=\"" + f(SX(*e)) + "\" cy=\"" + f(Y(e->metrics.relative_l2)) + "\" r=\"" +
             (fail ? "5" : "3.5") + "\" fill=\"" + s.colour + "\"" +
             (fail ? " stroke=\"#d62728\" stroke-width=\"2\"" : "") + "><title>" + e->path + ": " +
             number(e->metrics.relative_l2) + (fail ? " (FAIL)" : "") + "</title></circle>\n";
    }
    svg += "<circle cx=\"" + f(kWidth - kRight + 16) + "\" cy=\"" + f(legend_y) + "\" r=\"4\" fill=\"" +
           s.colour + "\"/><text x=\"" + f(kWidth - kRight + 26) + "\" y=\"" + f(legend_y + 4) + "\">" +
           s.kind + "</text>\n";
    legend_y += 18;
  }
  svg += "<line x1=\"" + f(kWidth - kRight + 8) + "\" x2=\"" + f(kWidth - kRight + 24) + "\" y1=\"" +
         f(legend_y) + "\" y2=\"" + f(legend_y) +
         "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\" stroke-width=\"1.5\"/><text x=\"" +
         f(kWidth - kRight + 28) + "\" y=\"" + f(legend_y + 4) + "\">tolerance</text>\n";
  svg += "<text x=\"" + f(kWidth - kRight + 8) + "\" y=\"" + f(legend_y + 22) + "\">ringed: FAIL</text>\n";
  svg += "<text x=\"" + f(kWidth - kRight + 8) + "\" y=\"" + f(legend_y + 40) +
         "\">0 is drawn at 1e-18</text>\n</svg>\n";
  return svg;
}

}  // namespace touchstone::diff
