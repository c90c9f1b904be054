// Loading a candidate in any supported format into the golden schema (recorded.h):
//   golden       an HDF5 file in the golden schema, possibly holding only some datasets;
//   safetensors  a .safetensors file (or a directory of them) with HF Llama or contract names, holding
//                the parameters or the gradients of one step (--candidate-kind, --step);
//   shards       a directory with shards.json and one HDF5 file per (tp, pp) rank in Megatron-LM's
//                layouts (shards.h), as written by tools/import_megatron_dump.py.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/h5_file.h"
#include "oracle/golden/golden_reader.h"
#include "oracle/golden/recorded.h"

namespace touchstone::diff {

enum class CandidateFormat { kAuto, kGolden, kSafetensors, kShards };
std::string candidate_format_name(CandidateFormat format);  // "auto", "golden", "safetensors", "shards"

// What the tensors of a safetensors candidate are.
enum class CandidateKind { kGrads, kParams };
std::string candidate_kind_name(CandidateKind kind);  // "grads" or "params"

struct CandidateOptions {
  CandidateFormat format = CandidateFormat::kAuto;  // kAuto: detect_candidate_format
  std::optional<CandidateKind> kind;                // safetensors only, and needed there
  std::optional<int64_t> step;  // safetensors: the step the tensors belong to (params: 0 = initial)
};

// The format of the candidate at `path` as its contents show it: a directory with shards.json or
// .safetensors files, a .safetensors file, or an HDF5 file (the golden schema). None when it is a file
// of neither kind; throws InputError for a missing path or a directory of neither.
std::optional<CandidateFormat> detect_candidate_format(const std::string& path);

struct Candidate {
  TensorMap tensors;
  std::string format;              // the format that was read
  std::string generator;           // the candidate's `generator` attribute, when it has one
  std::vector<std::string> notes;  // what was left out while reading, and why
  // Copies that must be equal and are not: the cp ranks' copies of a parameter or gradient shard
  // (shards.h). The candidate fails with them, whatever its compared tensors do.
  std::vector<std::string> replica_disagreements;
};

// Throws InputError naming the file for anything unreadable or inconsistent with the golden model.
Candidate load_candidate(const std::string& path, const CandidateOptions& options,
                         const GoldenReader& golden);

// One dataset with its stored type.
Recorded read_recorded(const h5::H5Reader& file, const std::string& path);

}  // namespace touchstone::diff
