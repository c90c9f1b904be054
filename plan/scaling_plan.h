// `touchstone plan scaling`: the scaling table of a set of measured runs (one CSV row each):
// micro-batches per replica, tokens/s, speedup and scaling efficiency against the smallest run, and
// the 1F1B pipeline bubble (p - 1) / (m + p - 1); plus warnings when the measurement windows are not
// comparable. The CSV format is defined in docs/planning.md.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace touchstone::plan {

// The CSV header, in this order.
inline constexpr const char* kScalingCsvHeader =
    "gpus,tp,pp,dp,global_batch,micro_batch,window_start_s,window_end_s,updates,tokens,checkpoint_in_window,"
    "warmup_excluded";

struct ScalingRun {
  int64_t line = 0;  // in the CSV, for messages
  int64_t gpus = 0, tp = 0, pp = 0, dp = 0, global_batch = 0, micro_batch = 0;
  double window_start_s = 0, window_end_s = 0;
  int64_t updates = 0;
  double tokens = 0;                  // non-padding tokens processed inside the window
  bool checkpoint_in_window = false;  // a checkpoint save happened inside the window
  bool warmup_excluded = false;       // the window starts after start-up, compilation and warm-up
};

// Parses the CSV text; `origin` names the file in messages ("runs.csv:4: ..."). Blank lines and lines
// starting with '#' are skipped. Throws InputError naming the line for a malformed row, a layout whose
// gpus != tp x pp x dp, or a global batch DP x micro-batch does not divide.
std::vector<ScalingRun> parse_scaling_csv(const std::string& text, const std::string& origin);
std::vector<ScalingRun> read_scaling_csv(const std::string& path);

struct ScalingRow {
  ScalingRun run;
  int64_t micro_batches = 0;  // per replica per update: global_batch / (dp x micro_batch)
  double window_s = 0;
  double tokens_per_s = 0;
  double speedup = 0;     // tokens/s over the reference run's
  double gpu_ratio = 0;   // GPUs over the reference run's
  double efficiency = 0;  // speedup / gpu_ratio
  double bubble = 0;      // (pp - 1) / (m + pp - 1)
};

struct ScalingTable {
  std::vector<ScalingRow> rows;  // sorted by GPU count (stable)
  size_t reference = 0;          // index of the smallest run
  std::vector<std::string> warnings;
};

ScalingTable scaling_table(const std::vector<ScalingRun>& runs);

void print_scaling_table(const ScalingTable& table, std::ostream& out);

// A self-contained SVG: tokens/s (with the ideal linear line) and scaling efficiency against GPUs.
std::string scaling_chart_svg(const ScalingTable& table);

}  // namespace touchstone::plan
