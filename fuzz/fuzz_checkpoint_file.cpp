// Fuzzes the checkpoint reader (checkpoint/checkpoint_file.h) below its whole-file checksum: the stored
// config (checkpoint_config), then read_checkpoint_file, which checks the format, the compatibility of
// the stored run, every tensor's name, shape, type and fnv1a64 checksum, and the progress scalars.
// The run's config is the stored one when it is a valid config (so the tensors are reached), else the
// defaults. Finding: a crash, sanitizer report, leak, hang or out-of-memory, or an exception other
// than InputError (fuzz_input.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint_file.h"
#include "common/config.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::InputFile file("fuzz_checkpoint_file");
  const std::string& path = file.write(data, size);
  touchstone::Config run = touchstone::resolve_config(nullptr, {}, "defaults");
  touchstone::fuzz::expect_input_errors_only([&] {
    touchstone::Config stored = touchstone::checkpoint_config(path);
    stored.parallel = touchstone::ParallelConfig{};  // a resume may change the layout
    touchstone::validate_config(stored, 1);
    run = stored;
  });
  touchstone::fuzz::expect_input_errors_only([&] { (void)touchstone::read_checkpoint_file(path, run); });
  return 0;
}
