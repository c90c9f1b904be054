// The scaling chart: a self-contained SVG (no fonts, scripts or external files) drawn from the table.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/text_output.h"
#include "plan/format.h"
#include "plan/scaling_plan.h"

namespace touchstone::plan {

namespace {

constexpr double kWidth = 800, kHeight = 460;
constexpr double kLeft = 90, kRight = 710, kTop = 70, kBottom = 380;  // the plot area

std::string number(double value) { return fixed(value, 1); }

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
  const auto x_of = [&](double gpus) {
    return kLeft + (std::log2(gpus) - x_lo) / (x_hi - x_lo) * (kRight - kLeft);
  };
  const double step = round_tick_step(max_tps * 1.1, 5);
  const double y_top = std::ceil(max_tps * 1.1 / step) * step;
  const auto y_of_tps = [&](double tps) { return kBottom - tps / y_top * (kBottom - kTop); };
  const auto y_of_eff = [&](double eff) { return kBottom - eff / 1.2 * (kBottom - kTop); };  // 0..120%

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"13\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kWidth / 2
      << "\" y=\"28\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"bold\">"
      << "Throughput and scaling efficiency against GPUs</text>\n";
  // Grid and left axis (tokens/s).
  for (double v = 0; v <= y_top + step / 2; v += step) {
    const double y = y_of_tps(v);
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << number(y) << "\" x2=\"" << kRight << "\" y2=\""
        << number(y) << "\" stroke=\"#e4e4e4\"/>\n<text x=\"" << kLeft - 8 << "\" y=\"" << number(y + 4)
        << "\" text-anchor=\"end\" fill=\"#1f5fa8\">" << short_quantity(v) << "</text>\n";
  }
  // Right axis (efficiency).
  for (int pct = 0; pct <= 120; pct += 20) {
    svg << "<text x=\"" << kRight + 8 << "\" y=\"" << number(y_of_eff(pct / 100.0) + 4)
        << "\" fill=\"#c0550f\">" << pct << "%</text>\n";
  }
  svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kRight - kLeft << "\" height=\""
      << kBottom - kTop << "\" fill=\"none\" stroke=\"#444\"/>\n";
  // X ticks at the measured GPU counts.
  for (const ScalingRow& row : table.rows) {
    const double x = x_of(static_cast<double>(row.run.gpus));
    svg << "<line x1=\"" << number(x) << "\" y1=\"" << kBottom << "\" x2=\"" << number(x) << "\" y2=\""
        << kBottom + 6 << "\" stroke=\"#444\"/>\n<text x=\"" << number(x) << "\" y=\"" << kBottom + 22
        << "\" text-anchor=\"middle\">" << row.run.gpus << "</text>\n";
  }
  svg << "<text x=\"" << (kLeft + kRight) / 2 << "\" y=\"" << kBottom + 48
      << "\" text-anchor=\"middle\">GPUs (log scale)</text>\n"
      << "<text transform=\"translate(24," << (kTop + kBottom) / 2
      << ") rotate(-90)\" text-anchor=\"middle\" "
      << "fill=\"#1f5fa8\">non-padding tokens/s</text>\n"
      << "<text transform=\"translate(" << kWidth - 20 << "," << (kTop + kBottom) / 2
      << ") rotate(90)\" text-anchor=\"middle\" fill=\"#c0550f\">scaling efficiency</text>\n";

  std::ostringstream ideal, measured, efficiency;
  for (const ScalingRow& row : table.rows) {
    const double x = x_of(static_cast<double>(row.run.gpus));
    ideal << number(x) << "," << number(y_of_tps(reference.tokens_per_s * row.gpu_ratio)) << " ";
    measured << number(x) << "," << number(y_of_tps(row.tokens_per_s)) << " ";
    efficiency << number(x) << "," << number(y_of_eff(row.efficiency)) << " ";
  }
  svg << "<polyline points=\"" << ideal.str()
      << "\" fill=\"none\" stroke=\"#888\" stroke-dasharray=\"6 4\"/>\n"
      << "<polyline points=\"" << measured.str()
      << "\" fill=\"none\" stroke=\"#1f5fa8\" stroke-width=\"2.5\"/>\n"
      << "<polyline points=\"" << efficiency.str()
      << "\" fill=\"none\" stroke=\"#c0550f\" stroke-width=\"2\"/>\n";
  for (const ScalingRow& row : table.rows) {
    const double x = x_of(static_cast<double>(row.run.gpus));
    const double yt = y_of_tps(row.tokens_per_s), ye = y_of_eff(row.efficiency);
    svg << "<circle cx=\"" << number(x) << "\" cy=\"" << number(yt) << "\" r=\"4.5\" fill=\"#1f5fa8\"/>\n"
        << "<text x=\"" << number(x - 8) << "\" y=\"" << number(yt - 10)
        << "\" text-anchor=\"end\" fill=\"#1f5fa8\">" << short_quantity(row.tokens_per_s) << "</text>\n"
        << "<rect x=\"" << number(x - 4) << "\" y=\"" << number(ye - 4)
        << "\" width=\"8\" height=\"8\" fill=\"#c0550f\"/>\n"
        << "<text x=\"" << number(x + 8) << "\" y=\"" << number(ye - 8) << "\" fill=\"#c0550f\">"
        << percent(row.efficiency, 0) << "</text>\n";
  }
  // Legend.
  const double ly = 50;
  svg << "<line x1=\"" << kLeft << "\" y1=\"" << ly << "\" x2=\"" << kLeft + 26 << "\" y2=\"" << ly
      << "\" stroke=\"#1f5fa8\" stroke-width=\"2.5\"/><text x=\"" << kLeft + 32 << "\" y=\"" << ly + 4
      << "\">measured tokens/s</text>\n"
      << "<line x1=\"" << kLeft + 180 << "\" y1=\"" << ly << "\" x2=\"" << kLeft + 206 << "\" y2=\"" << ly
      << "\" stroke=\"#888\" stroke-dasharray=\"6 4\"/><text x=\"" << kLeft + 212 << "\" y=\"" << ly + 4
      << "\">linear scaling from " << reference.run.gpus << " GPUs</text>\n"
      << "<line x1=\"" << kLeft + 420 << "\" y1=\"" << ly << "\" x2=\"" << kLeft + 446 << "\" y2=\"" << ly
      << "\" stroke=\"#c0550f\" stroke-width=\"2\"/><text x=\"" << kLeft + 452 << "\" y=\"" << ly + 4
      << "\">scaling efficiency</text>\n"
      << "</svg>\n";
  return svg.str();
}

}  // namespace touchstone::plan
