// `touchstone plan scaling`: the scaling table of a set of measured runs (one CSV row each):
// micro-batches per replica, tokens/s, speedup and scaling efficiency against the smallest run, and
// the share of the step the pipeline idles under 1F1B, interleaved 1F1B and ZB-H1; plus warnings when
// the measurement windows are not comparable. The CSV format is defined in docs/planning.md.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace touchstone::plan {

// The CSV header, in this order; a run with context parallelism adds the column cp after tp
// (kScalingCsvHeaderWithCp). Without it every run has cp = 1.
inline constexpr const char* kScalingCsvHeader =
    "gpus,tp,pp,dp,global_batch,micro_batch,window_start_s,window_end_s,updates,tokens,checkpoint_in_window,"
    "warmup_excluded";
inline constexpr const char* kScalingCsvHeaderWithCp =
    "gpus,tp,cp,pp,dp,global_batch,micro_batch,window_start_s,window_end_s,updates,tokens,"
    "checkpoint_in_window,warmup_excluded";

struct ScalingRun {
  int64_t line = 0;  // in the CSV, for messages
  int64_t gpus = 0, tp = 0, cp = 1, pp = 0, dp = 0, global_batch = 0, micro_batch = 0;
  double window_start_s = 0, window_end_s = 0;
  int64_t updates = 0;
  double tokens = 0;                  // non-padding tokens processed inside the window
  bool checkpoint_in_window = false;  // a checkpoint save happened inside the window
  bool warmup_excluded = false;       // the window starts after start-up, compilation and warm-up
};

// Parses the CSV text; `origin` names the file in messages ("runs.csv:4: ..."). Blank lines and lines
// starting with '#' are skipped. Throws InputError naming the line for a malformed row, a layout whose
// gpus != tp x cp x pp x dp, or a global batch DP x micro-batch does not divide.
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
  // The share of the step each stage idles, bubble / (ideal + bubble), in units of one micro-batch's
  // forward on a whole stage (pipeline::simulate_schedules reproduces each exactly):
  double bubble = 0;  // 1F1B, backward = 2 forwards: (pp - 1) / (m + pp - 1)
  // Interleaved 1F1B with v chunks per stage: (pp - 1) / (v m + pp - 1); none where Megatron-LM
  // refuses m (not a multiple of pp).
  std::optional<double> interleaved_bubble;
  // ZB-H1 with forward = input-gradient half = weight-gradient half: (pp - 1) / (3m + pp - 1); none
  // for m < pp, where the pipeline never fills and the formula does not hold.
  std::optional<double> zero_bubble_h1_bubble;
};

struct ScalingTable {
  std::vector<ScalingRow> rows;  // sorted by GPU count (stable)
  size_t reference = 0;          // index of the smallest run
  int64_t virtual_stages = 2;    // v of the interleaved column
  std::vector<std::string> warnings;
};

// Model chunks per stage of the interleaved bubble: at least 2 (1 is 1F1B) and at most 2^20.
inline constexpr int64_t kMaxVirtualStages = int64_t{1} << 20;

// Throws InputError for virtual_stages outside [2, kMaxVirtualStages].
ScalingTable scaling_table(const std::vector<ScalingRun>& runs, int64_t virtual_stages = 2);

void print_scaling_table(const ScalingTable& table, std::ostream& out);

// A self-contained SVG: tokens/s (with the ideal linear line) and scaling efficiency against GPUs.
std::string scaling_chart_svg(const ScalingTable& table);

}  // namespace touchstone::plan
