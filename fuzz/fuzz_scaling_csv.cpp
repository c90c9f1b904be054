// Fuzzes the scaling CSV of `touchstone plan scaling` (plan/scaling_plan.h): parse_scaling_csv, then
// the table, its printout and its chart, as the command does with the runs it read.
// Finding: a crash, sanitizer report, leak, hang or out-of-memory, or an exception other than
// InputError (fuzz_input.h).
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "fuzz/fuzz_input.h"
#include "plan/scaling_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  namespace plan = touchstone::plan;
  touchstone::fuzz::expect_input_errors_only([&] {
    const auto runs = plan::parse_scaling_csv(text, "runs.csv");
    if (runs.empty()) return;
    const plan::ScalingTable table = plan::scaling_table(runs);
    std::ostringstream out;
    plan::print_scaling_table(table, out);
    (void)plan::scaling_chart_svg(table);
  });
  return 0;
}
