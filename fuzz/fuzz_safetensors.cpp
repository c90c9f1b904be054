// Fuzzes the safetensors reader of `touchstone diff` (oracle/hf/safetensors.h): the 8-byte header
// length, the JSON header and every tensor's dtype, shape and data offsets, then the decoded values.
// Finding: a crash, sanitizer report, leak, hang or out-of-memory, or an exception other than
// InputError (fuzz_input.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_input.h"
#include "oracle/hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::InputFile file("fuzz_safetensors");
  const std::string& path = file.write(data, size);
  touchstone::fuzz::expect_input_errors_only([&] { (void)touchstone::hf::read_safetensors(path); });
  return 0;
}
