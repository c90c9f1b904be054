// Candidate formats: detection, the golden-schema HDF5 reader and the safetensors conversion.
#include "oracle/diff/candidate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/errors.h"
#include "oracle/diff/metrics.h"
#include "oracle/diff/shards.h"
#include "oracle/diff/stored_copy.h"
#include "oracle/hf/hf_names.h"
#include "oracle/hf/safetensors.h"

namespace touchstone::diff {

namespace fs = std::filesystem;

std::string candidate_format_name(CandidateFormat format) {
  switch (format) {
    case CandidateFormat::kAuto:
      return "auto";
    case CandidateFormat::kGolden:
      return "golden";
    case CandidateFormat::kSafetensors:
      return "safetensors";
    case CandidateFormat::kShards:
      return "shards";
  }
  return "unknown";
}

std::string candidate_kind_name(CandidateKind kind) {
  return kind == CandidateKind::kGrads ? "grads" : "params";
}

Recorded read_recorded(const h5::H5Reader& file, const std::string& path) {
  const std::string object = "/" + path;
  Recorded recorded{file.shape(object), file.read_f64(object), file.element_type(object)};
  // HDF5 has no bfloat16: a 16-bit copy is stored widened, its type in the attribute stored_dtype.
  if (!file.has_attribute(object, "stored_dtype")) return recorded;
  const std::string where = file.path() + ": " + path + ": stored_dtype";
  const std::string type = file.string_attribute(object, "stored_dtype");
  if (type != "bfloat16" && type != "float16") {
    throw InputError(where + " " + type + " is not bfloat16 or float16");
  }
  if (recorded.dtype != "float32" && recorded.dtype != "float64" && recorded.dtype != type) {
    throw InputError(where + " " + type + " on a " + recorded.dtype +
                     " dataset (float32 or float64 expected)");
  }
  for (size_t i = 0; i < recorded.values.size(); ++i) {
    const double x = recorded.values[i];
    if (std::isfinite(x) && round_to_copy(x, type) != x) {
      char value[32];
      std::snprintf(value, sizeof value, recorded.dtype == "float64" ? "%.17g" : "%.9g", x);
      throw InputError(where + " " + type + ", but element " +
                       shape_text(unravel(static_cast<int64_t>(i), recorded.shape)) + " = " + value +
                       " is not a " + type + " number");
    }
  }
  recorded.dtype = type;
  return recorded;
}

namespace {

bool has_extension(const fs::path& path, const std::string& extension) {
  return path.extension() == extension;
}

bool starts_with_hdf5_signature(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char signature[8] = {};
  in.read(signature, 8);
  return in.gcount() == 8 && std::string(signature, 8) == std::string("\x89HDF\r\n\x1a\n", 8);
}

// "steps/<s>/..." with s a step number (digits only), or "params/init/...".
bool in_compared_schema(const std::string& dataset) {
  if (dataset.rfind("params/init/", 0) == 0) return true;
  if (dataset.rfind("steps/", 0) != 0) return false;
  const size_t slash = dataset.find('/', 6);
  return slash != std::string::npos && slash > 6 &&
         std::all_of(dataset.begin() + 6, dataset.begin() + static_cast<std::ptrdiff_t>(slash),
                     [](char c) { return c >= '0' && c <= '9'; });
}

// Each dataset's declared shape is compared with the golden's before its values are read: a candidate
// declaring a huge dataset costs nothing unless the golden holds one of that shape. A dataset of another
// shape, or one the golden file does not have, is kept with its shape only (no values): the comparison
// reports the first as a failure and the second in a note.
Candidate load_golden_schema(const std::string& path, const GoldenReader& golden) {
  const h5::H5Reader file(path);
  Candidate candidate;
  candidate.format = "golden";
  if (file.has_attribute("/", "generator")) candidate.generator = file.string_attribute("/", "generator");
  for (const std::string& dataset : file.datasets_below("/")) {
    if (!in_compared_schema(dataset)) {
      if (dataset.rfind("batch/", 0) != 0) {
        candidate.notes.push_back("ignored candidate dataset /" + dataset +
                                  " (not part of the compared schema)");
      }
      continue;
    }
    const std::string object = "/" + dataset;
    std::vector<int64_t> shape = file.shape(object);
    checked_numel(shape, path + ": " + object);
    const auto scalar = [](const std::vector<int64_t>& s) {
      return s.empty() || s == std::vector<int64_t>{1};
    };
    const auto same_shape = [&](const std::vector<int64_t>& other) {
      return other == shape || (scalar(other) && scalar(shape));
    };
    if (golden.has(dataset) && same_shape(golden.checked_shape(object))) {
      candidate.tensors.emplace(dataset, read_recorded(file, dataset));
    } else {
      candidate.tensors.emplace(dataset, Recorded{std::move(shape), {}, file.element_type(object)});
    }
  }
  return candidate;
}

Candidate load_safetensors(const std::string& path, const CandidateOptions& options,
                           const GoldenReader& golden) {
  if (!options.kind) throw InputError(path + ": a safetensors candidate needs its kind, grads or params");
  const std::string kind = candidate_kind_name(*options.kind);
  const int64_t step = options.step.value_or(1);
  if (step < (options.kind == CandidateKind::kParams ? 0 : 1)) {
    throw InputError("step " + std::to_string(step) + " is not a step with " + kind);
  }
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& entry : fs::directory_iterator(path)) {
      if (has_extension(entry.path(), ".safetensors")) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::map<std::string, Recorded> all;
  for (const fs::path& file : files) {
    for (auto& [name, tensor] : hf::read_safetensors(file.string())) {
      if (!all.emplace(name, std::move(tensor)).second) {
        throw InputError(file.string() + ": tensor " + name + " appears in more than one file");
      }
    }
  }
  // Step 0 holds parameters only (gradients start at step 1, refused above).
  const std::string group = step == 0 ? "params/init" : "steps/" + std::to_string(step) + "/" + kind;
  Candidate candidate;
  candidate.format = "safetensors (" + kind + " of " +
                     (step == 0 ? "the initial state" : "step " + std::to_string(step)) + ")";
  std::vector<std::string> ignored;
  candidate.tensors = hf::hf_to_contract(all, golden.config().model, group, ignored);
  for (const std::string& name : ignored) candidate.notes.push_back("ignored safetensors tensor " + name);
  if (candidate.tensors.empty()) throw InputError(path + ": no tensor with a known name");
  return candidate;
}

}  // namespace

std::optional<CandidateFormat> detect_candidate_format(const std::string& path) {
  if (!fs::exists(path)) throw InputError(path + ": no such file or directory");
  if (fs::is_directory(path)) {
    if (fs::exists(fs::path(path) / "shards.json")) return CandidateFormat::kShards;
    for (const auto& entry : fs::directory_iterator(path)) {
      if (has_extension(entry.path(), ".safetensors")) return CandidateFormat::kSafetensors;
    }
    throw InputError(path + ": a directory without shards.json or .safetensors files");
  }
  if (has_extension(path, ".safetensors")) return CandidateFormat::kSafetensors;
  if (starts_with_hdf5_signature(path)) return CandidateFormat::kGolden;
  return std::nullopt;
}

Candidate load_candidate(const std::string& path, const CandidateOptions& options,
                         const GoldenReader& golden) {
  std::optional<CandidateFormat> format = options.format;
  if (format == CandidateFormat::kAuto) format = detect_candidate_format(path);
  if (!format) throw InputError(path + ": neither HDF5 nor a .safetensors file, and no format was named");
  if (format != CandidateFormat::kSafetensors && options.kind) {
    throw InputError("a candidate kind applies to safetensors candidates only (this one is read as " +
                     candidate_format_name(*format) + ")");
  }
  switch (*format) {
    case CandidateFormat::kGolden:
      return load_golden_schema(path, golden);
    case CandidateFormat::kSafetensors:
      return load_safetensors(path, options, golden);
    case CandidateFormat::kShards:
      return load_shards(path, golden);
    case CandidateFormat::kAuto:
      break;
  }
  throw std::logic_error("load_candidate: a detected format is never auto");
}

}  // namespace touchstone::diff
