// Scaling CSV parsing, the scaling table and the comparability warnings.
#include "plan/scaling_plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>

#include "common/errors.h"
#include "plan/checked.h"
#include "plan/format.h"

namespace touchstone::plan {

namespace {

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream stream(line);
  while (std::getline(stream, field, ',')) {
    const size_t first = field.find_first_not_of(" \t\r");
    const size_t last = field.find_last_not_of(" \t\r");
    fields.push_back(first == std::string::npos ? "" : field.substr(first, last - first + 1));
  }
  if (!line.empty() && line.back() == ',') fields.push_back("");
  return fields;
}

class RowReader {
 public:
  RowReader(const std::string& where, const std::vector<std::string>& names,
            const std::vector<std::string>& fields)
      : where_(where), names_(names), fields_(fields) {}

  int64_t integer(size_t column, int64_t minimum, int64_t maximum) const {
    const std::string& text = fields_[column];
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) fail(column, "\"" + text + "\" is not an integer");
    if (value < minimum) fail(column, text + " must be >= " + std::to_string(minimum));
    if (value > maximum) fail(column, text + " must be <= " + std::to_string(maximum));
    return value;
  }

  // A non-negative number up to 2^53: past it a double holds no exact count or second, and the table
  // prints every count digit by digit.
  double number(size_t column) const {
    const std::string& text = fields_[column];
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() || !std::isfinite(value))
      fail(column, "\"" + text + "\" is not a number");
    if (value < 0) fail(column, text + " must be >= 0");
    if (value > kMaxExactCount) fail(column, text + " must be <= 2^53 (9007199254740992)");
    return value;
  }

  bool flag(size_t column) const {
    std::string text = fields_[column];
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
    if (text == "1" || text == "true" || text == "yes") return true;
    if (text == "0" || text == "false" || text == "no") return false;
    fail(column, "\"" + fields_[column] + "\" is not 0/1, true/false or yes/no");
  }

  [[noreturn]] void fail(size_t column, const std::string& message) const {
    throw InputError(where_ + ": column " + names_[column] + ": " + message);
  }

 private:
  std::string where_;
  const std::vector<std::string>& names_;
  const std::vector<std::string>& fields_;
};

ScalingRun parse_row(const std::string& where, int64_t line, const std::vector<std::string>& names,
                     const std::vector<std::string>& fields) {
  if (fields.size() != names.size()) {
    throw InputError(where + ": expected " + std::to_string(names.size()) +
                     " comma-separated fields, found " + std::to_string(fields.size()));
  }
  const RowReader r(where, names, fields);
  // The header is one of the two of scaling_plan.h: the columns by name.
  auto column = [&](const char* name) {
    return static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  const bool with_cp = column("cp") < names.size();
  ScalingRun run;
  run.line = line;
  // Upper bounds far past any cluster keep the checks below inside int64: the grid's product stops
  // growing once past 2^20 GPUs (each factor is at most 2^20, so no step passes 2^40), and 2^40 samples
  // per batch stay < 2^60 with dp.
  constexpr int64_t kMaxGridSize = int64_t{1} << 20;
  constexpr int64_t kMaxCount = int64_t{1} << 40;
  run.gpus = r.integer(column("gpus"), 1, kMaxGridSize);
  run.tp = r.integer(column("tp"), 1, kMaxGridSize);
  if (with_cp) run.cp = r.integer(column("cp"), 1, kMaxGridSize);
  run.pp = r.integer(column("pp"), 1, kMaxGridSize);
  run.dp = r.integer(column("dp"), 1, kMaxGridSize);
  run.global_batch = r.integer(column("global_batch"), 1, kMaxCount);
  run.micro_batch = r.integer(column("micro_batch"), 1, kMaxCount);
  run.window_start_s = r.number(column("window_start_s"));
  run.window_end_s = r.number(column("window_end_s"));
  run.updates = r.integer(column("updates"), 1, kMaxCount);
  run.tokens = r.number(column("tokens"));
  run.checkpoint_in_window = r.flag(column("checkpoint_in_window"));
  run.warmup_excluded = r.flag(column("warmup_excluded"));
  std::vector<int64_t> grid{run.tp, run.pp, run.dp};
  std::string grid_names = "tp x pp x dp", grid_values;
  if (with_cp) {
    grid.insert(grid.begin() + 1, run.cp);
    grid_names = "tp x cp x pp x dp";
  }
  int64_t product = 1;
  for (const int64_t size : grid) {
    grid_values += (grid_values.empty() ? "" : " x ") + std::to_string(size);
    if (product <= kMaxGridSize) product *= size;
  }
  if (run.gpus != product) {
    throw InputError(
        where + ": gpus " + std::to_string(run.gpus) + " is not " + grid_names + " = " + grid_values + " = " +
        (product > kMaxGridSize ? "more than " + std::to_string(kMaxGridSize) : std::to_string(product)));
  }
  if (run.global_batch % (run.dp * run.micro_batch) != 0) {
    throw InputError(where + ": global_batch " + std::to_string(run.global_batch) +
                     " is not divisible by dp x micro_batch = " + std::to_string(run.dp) + " x " +
                     std::to_string(run.micro_batch) + " = " + std::to_string(run.dp * run.micro_batch));
  }
  if (run.window_end_s <= run.window_start_s) {
    throw InputError(where + ": window_end_s " + fields[column("window_end_s")] +
                     " is not after window_start_s " + fields[column("window_start_s")]);
  }
  // At least one token: fewer makes the rate underflow to 0, and the speedups of the others infinite.
  if (run.tokens < 1) throw InputError(where + ": column tokens: must be >= 1");
  const double tokens_per_s = run.tokens / (run.window_end_s - run.window_start_s);
  if (!(tokens_per_s <= kMaxExactCount)) {
    throw InputError(where + ": tokens / (window_end_s - window_start_s) = " + scientific(tokens_per_s) +
                     " tokens/s, more than 2^53: the window is too short for its tokens");
  }
  return run;
}

}  // namespace

std::vector<ScalingRun> parse_scaling_csv(const std::string& text, const std::string& origin) {
  std::istringstream stream(text);
  std::string line;
  std::vector<std::string> names;
  std::vector<ScalingRun> runs;
  const std::vector<std::string> expected = split_fields(kScalingCsvHeader);
  const std::vector<std::string> expected_with_cp = split_fields(kScalingCsvHeaderWithCp);
  for (int64_t number = 1; std::getline(stream, line); ++number) {
    const std::string where = origin + ":" + std::to_string(number);
    const size_t start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos || line[start] == '#') continue;
    const std::vector<std::string> fields = split_fields(line);
    if (names.empty()) {
      if (fields != expected && fields != expected_with_cp) {
        throw InputError(where + ": the header must be exactly " + std::string(kScalingCsvHeader) +
                         " (or with cp after tp: " + kScalingCsvHeaderWithCp + ")");
      }
      names = fields;
      continue;
    }
    runs.push_back(parse_row(where, number, names, fields));
  }
  if (names.empty()) throw InputError(origin + ": no header line (" + std::string(kScalingCsvHeader) + ")");
  if (runs.empty()) throw InputError(origin + ": no runs after the header");
  return runs;
}

std::vector<ScalingRun> read_scaling_csv(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw InputError(path + ": cannot open the scaling CSV");
  std::ostringstream text;
  text << file.rdbuf();
  return parse_scaling_csv(text.str(), path);
}

namespace {

std::string gpu_list(const std::vector<const ScalingRow*>& rows) {
  std::string text;
  for (const ScalingRow* row : rows) text += (text.empty() ? "" : ", ") + std::to_string(row->run.gpus);
  return text + " GPUs";
}

// The runs whose `key` differs, grouped by value, as "1920 at 512, 1024 GPUs; 960 at 2560 GPUs".
template <typename Key>
std::string describe_groups(const std::vector<ScalingRow>& rows, Key key) {
  std::map<std::string, std::vector<const ScalingRow*>> groups;
  std::vector<std::string> order;
  for (const ScalingRow& row : rows) {
    const std::string value = key(row);
    if (groups.find(value) == groups.end()) order.push_back(value);
    groups[value].push_back(&row);
  }
  if (order.size() < 2) return "";
  std::string text;
  for (const std::string& value : order)
    text += (text.empty() ? "" : "; ") + value + " at " + gpu_list(groups[value]);
  return text;
}

std::vector<std::string> comparability_warnings(const std::vector<ScalingRow>& rows) {
  std::vector<std::string> warnings;
  if (rows.size() < 2) warnings.push_back("only one run: there is nothing to compare it with");
  std::vector<const ScalingRow*> cold, with_checkpoint;
  for (const ScalingRow& row : rows) {
    if (!row.run.warmup_excluded) cold.push_back(&row);
    if (row.run.checkpoint_in_window) with_checkpoint.push_back(&row);
  }
  if (!cold.empty() && cold.size() < rows.size()) {
    warnings.push_back(
        "cold start mixed with steady state: the windows of " + gpu_list(cold) +
        " include start-up (warmup_excluded = 0), the others do not; compare steady-state windows");
  } else if (!cold.empty()) {
    warnings.push_back(
        "no window excludes start-up (warmup_excluded = 0 everywhere): these are not steady-state "
        "throughputs");
  }
  if (!with_checkpoint.empty() && with_checkpoint.size() < rows.size()) {
    warnings.push_back("checkpoint saves fall inside the window of " + gpu_list(with_checkpoint) +
                       " only: their tokens/s include save time, the others' do not");
  }
  const std::string batches =
      describe_groups(rows, [](const ScalingRow& r) { return std::to_string(r.run.global_batch); });
  if (!batches.empty()) {
    warnings.push_back("different global batch (" + batches +
                       "): micro-batches per replica, bubble and convergence all change with it");
  }
  const std::string updates =
      describe_groups(rows, [](const ScalingRow& r) { return std::to_string(r.run.updates); });
  if (!updates.empty()) {
    warnings.push_back("different windows: they cover different numbers of updates (" + updates +
                       "); measure the same update range in every run");
  }
  // With the same global batch every update reads the same number of real tokens (the data order does
  // not depend on the layout), so a difference means different data or a different token count.
  for (const ScalingRow& a : rows) {
    for (const ScalingRow& b : rows) {
      if (&a >= &b || a.run.global_batch != b.run.global_batch) continue;
      const double per_update_a = a.run.tokens / static_cast<double>(a.run.updates);
      const double per_update_b = b.run.tokens / static_cast<double>(b.run.updates);
      if (std::abs(per_update_a - per_update_b) > 0.01 * std::max(per_update_a, per_update_b)) {
        warnings.push_back("tokens per update differ between " + std::to_string(a.run.gpus) + " and " +
                           std::to_string(b.run.gpus) + " GPUs (" + grouped(per_update_a) + " vs " +
                           grouped(per_update_b) +
                           ") at the same global batch: different data or padding counted");
      }
    }
  }
  return warnings;
}

}  // namespace

ScalingTable scaling_table(const std::vector<ScalingRun>& runs, int64_t virtual_stages) {
  if (virtual_stages < 2 || virtual_stages > kMaxVirtualStages) {
    throw InputError("plan scaling: virtual stages must lie in [2, " + std::to_string(kMaxVirtualStages) +
                     "], got " + std::to_string(virtual_stages));
  }
  ScalingTable table;
  table.virtual_stages = virtual_stages;
  for (const ScalingRun& run : runs) {
    ScalingRow row;
    row.run = run;
    row.micro_batches = run.global_batch / (run.dp * run.micro_batch);
    row.window_s = run.window_end_s - run.window_start_s;
    row.tokens_per_s = run.tokens / row.window_s;
    // Idle time over step time, in forwards of one micro-batch on a whole stage: each stage works 3m
    // (forward 1, backward 2) and idles 3(pp - 1) under 1F1B; interleaving makes each fill and drain
    // step one chunk, 1/v as long, 3(pp - 1)/v; ZB-H1 idles (pp - 1)(F + I - W) = pp - 1.
    const auto m = static_cast<double>(row.micro_batches);
    const auto idle = static_cast<double>(run.pp - 1);
    const auto v = static_cast<double>(virtual_stages);
    row.bubble = idle / (m + idle);
    if (row.micro_batches % run.pp == 0) row.interleaved_bubble = idle / (v * m + idle);
    if (row.micro_batches >= run.pp) row.zero_bubble_h1_bubble = idle / (3.0 * m + idle);
    table.rows.push_back(row);
  }
  std::stable_sort(table.rows.begin(), table.rows.end(),
                   [](const ScalingRow& a, const ScalingRow& b) { return a.run.gpus < b.run.gpus; });
  const ScalingRow& reference = table.rows[table.reference];
  for (ScalingRow& row : table.rows) {
    row.speedup = row.tokens_per_s / reference.tokens_per_s;
    row.gpu_ratio = static_cast<double>(row.run.gpus) / static_cast<double>(reference.run.gpus);
    row.efficiency = row.speedup / row.gpu_ratio;
  }
  table.warnings = comparability_warnings(table.rows);
  return table;
}

namespace {
std::string optional_percent(const std::optional<double>& share) { return share ? percent(*share, 1) : "-"; }
}  // namespace

void print_scaling_table(const ScalingTable& table, std::ostream& out) {
  const ScalingRow& reference = table.rows[table.reference];
  out << "Scaling against the smallest run (" << reference.run.gpus << " GPUs, line " << reference.run.line
      << "); m = micro-batches per replica per update\n"
      << "Bubble = share of the step the pipeline idles, per schedule:\n"
      << "  1F1B   (pp - 1) / (m + pp - 1)\n"
      << "  v" << table.virtual_stages << "     interleaved 1F1B, v = " << table.virtual_stages
      << " chunks per stage: (pp - 1) / (v m + pp - 1); - where m is not a multiple of pp\n"
      << "  ZB-H1  with equal F, I and W: (pp - 1) / (3m + pp - 1); - where m < pp\n\n";
  char line[512];
  const std::string interleaved = "v" + std::to_string(table.virtual_stages);
  // A CP column when some run splits its sequences over context-parallel ranks.
  const bool with_cp =
      std::any_of(table.rows.begin(), table.rows.end(), [](const ScalingRow& row) { return row.run.cp > 1; });
  std::snprintf(line, sizeof line, "%6s %3s", "GPUs", "TP");
  out << line << (with_cp ? "  CP" : "");
  std::snprintf(line, sizeof line, " %3s %4s %7s %3s %5s  %-17s %7s %15s %12s %8s %10s %7s %7s %7s %4s\n",
                "PP", "DP", "batch", "mbs", "m", "window (s)", "updates", "tokens", "tokens/s", "speedup",
                "efficiency", "1F1B", interleaved.c_str(), "ZB-H1", "ckpt");
  out << line;
  for (const ScalingRow& row : table.rows) {
    const ScalingRun& r = row.run;
    const std::string window = fixed(r.window_start_s, 1) + "-" + fixed(r.window_end_s, 1);
    std::snprintf(line, sizeof line, "%6lld %3lld", static_cast<long long>(r.gpus),
                  static_cast<long long>(r.tp));
    out << line;
    if (with_cp) {
      std::snprintf(line, sizeof line, " %3lld", static_cast<long long>(r.cp));
      out << line;
    }
    std::snprintf(
        line, sizeof line, " %3lld %4lld %7lld %3lld %5lld  %-17s %7lld %15s %12s %8s %10s %7s %7s %7s %4s\n",
        static_cast<long long>(r.pp), static_cast<long long>(r.dp), static_cast<long long>(r.global_batch),
        static_cast<long long>(r.micro_batch), static_cast<long long>(row.micro_batches), window.c_str(),
        static_cast<long long>(r.updates), grouped(r.tokens).c_str(), grouped(row.tokens_per_s).c_str(),
        (fixed(row.speedup, 2) + "x").c_str(), percent(row.efficiency, 0).c_str(),
        percent(row.bubble, 1).c_str(), optional_percent(row.interleaved_bubble).c_str(),
        optional_percent(row.zero_bubble_h1_bubble).c_str(), r.checkpoint_in_window ? "yes" : "no");
    out << line;
  }
  out << "\nScaling efficiency = speedup / GPU ratio; speedup = tokens/s over the " << reference.run.gpus
      << "-GPU run's.\n";
  for (const std::string& warning : table.warnings) out << "warning: " << warning << "\n";
}

}  // namespace touchstone::plan
