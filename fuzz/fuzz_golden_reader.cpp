// Fuzzes GoldenReader (oracle/golden/golden_reader.h), what `touchstone diff` and `touchstone check`
// open a golden file with: its format attributes and stored config, the steps, every dataset of every
// step, and each step's batch.
// Finding: a crash, sanitizer report, leak, hang or out-of-memory, or an exception other than
// InputError (fuzz_input.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_input.h"
#include "oracle/golden/golden_reader.h"

namespace {

// A damaged file may claim many steps; the first few reach every code path.
constexpr size_t kMostSteps = 4;

void read_everything(const touchstone::GoldenReader& golden) {
  size_t read_steps = 0;
  for (const int64_t step : golden.steps()) {
    if (++read_steps > kMostSteps) break;
    touchstone::fuzz::expect_input_errors_only([&] {
      for (const std::string& dataset : golden.step_datasets(step)) {
        touchstone::fuzz::expect_input_errors_only([&] { (void)golden.read(dataset); });
      }
    });
    touchstone::fuzz::expect_input_errors_only([&] { (void)golden.batch(step); });
    touchstone::fuzz::expect_input_errors_only([&] {
      const std::string before = golden.params_before(step);
      for (const touchstone::ParamSpec& spec : golden.table().specs()) {
        const std::string dataset = before.substr(1) + "/" + spec.name;
        if (golden.has(dataset)) (void)golden.read(dataset);
      }
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::InputFile file("fuzz_golden_reader");
  const std::string& path = file.write(data, size);
  touchstone::fuzz::expect_input_errors_only([&] {
    const touchstone::GoldenReader golden(path);
    read_everything(golden);
  });
  return 0;
}
