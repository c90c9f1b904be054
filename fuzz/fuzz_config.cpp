// Fuzzes the run configuration (common/config.h): a JSON config file read by read_config_file, then
// "section.key=value" overrides as the command line passes them, resolved by resolve_config and
// checked by validate_config; a config that passes is then cut into pipeline stages as a run would. The input
// is the config file, optionally followed by a NUL byte and one override per line. Finding: a crash,
// sanitizer report, leak, hang or out-of-memory, or an exception other than InputError (fuzz_input.h).
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::InputFile file("fuzz_config");
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string config_text = input.substr(0, split);
  std::vector<std::string> overrides;
  if (split != std::string::npos) {
    std::istringstream lines(input.substr(split + 1));
    for (std::string line; std::getline(lines, line);) overrides.push_back(line);
  }
  const std::string& path =
      file.write(reinterpret_cast<const uint8_t*>(config_text.data()), config_text.size());
  touchstone::fuzz::expect_input_errors_only([&] {
    const touchstone::Config config =
        touchstone::resolve_config(touchstone::read_config_file(path), overrides, "config.json");
    const touchstone::ParallelConfig& p = config.parallel;
    // The world size the run would be launched with, when the layout names a plausible one (else a
    // world of one, which such a layout does not match).
    constexpr int64_t kLargest = 1 << 10;
    const bool plausible = p.tp >= 1 && p.cp >= 1 && p.pp >= 1 && p.dp >= 1 && p.world_size() <= kLargest;
    touchstone::validate_config(config, plausible ? static_cast<int>(p.world_size()) : 1);
    (void)config.stage_boundaries();
    (void)touchstone::to_json(config).dump();  // what golden files and checkpoints store
  });
  return 0;
}
