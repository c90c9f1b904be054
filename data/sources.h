// Where documents come from: the built-in acceptance set or a .jsonl file.
#pragma once

#include <string>
#include <vector>

#include "data/packing.h"

namespace touchstone::data {

struct SourceOptions {
  std::string source;  // "builtin:acceptance" or a path to a .jsonl file
  int vocab_size = 0;
  int seq_length = 0;  // T (the built-in set is laid out relative to T)
  int32_t eos_token = 0;
  int32_t pad_token = 0;
};

// Reads the documents of `options.source`. Throws touchstone::InputError naming the file and line for
// a missing or empty file, a malformed line, an empty document, or a token id outside [0, vocab_size).
std::vector<Document> load_documents(const SourceOptions& options);

// The built-in acceptance set: documents whose packing into windows of T tokens exercises every data
// rule (see data/builtin_acceptance.cpp). Deterministic; independent of train.seed.
std::vector<Document> builtin_acceptance_documents(const SourceOptions& options);

// One JSON object per line, {"tokens": [int, ...]}; blank lines are not allowed.
std::vector<Document> read_jsonl_documents(const std::string& path, int vocab_size);

}  // namespace touchstone::data
