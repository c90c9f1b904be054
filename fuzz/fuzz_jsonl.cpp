// Fuzzes the .jsonl document reader (data/sources.h, read_jsonl_documents): one {"tokens": [...]} object
// per line, each token an integer inside the vocabulary, then packs what it read into windows as a run
// does (data/packing.h). The first input byte picks the vocabulary size, so the range checks are hit
// from both sides. Finding: a crash, sanitizer report, leak, hang or out-of-memory, or an exception
// other than InputError (fuzz_input.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "data/packing.h"
#include "data/sources.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::InputFile file("fuzz_jsonl");
  if (size == 0) return 0;
  const int vocab_size = static_cast<int>(data[0]) - 1;  // -1 to 254: 0 and below are refused
  const std::string& path = file.write(data + 1, size - 1);
  touchstone::fuzz::expect_input_errors_only([&] {
    const auto documents = touchstone::data::read_jsonl_documents(path, vocab_size);
    touchstone::data::PackingOptions packing;
    packing.seq_length = 7;  // prime, so documents and windows rarely line up
    packing.eos_token = 0;
    packing.pad_token = 1;
    (void)touchstone::data::pack_documents(documents, packing);
  });
  return 0;
}
