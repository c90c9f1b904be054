// Golden-file access for the diff: format checks, config, datasets and batches.
#include "oracle/golden/golden_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace touchstone {

namespace {

Config stored_config(const h5::H5Reader& reader) {
  if (!reader.has_attribute("/", "format") || reader.string_attribute("/", "format") != "touchstone-golden") {
    throw InputError(reader.path() +
                     ": not a golden file (root attribute format is not \"touchstone-golden\")");
  }
  if (reader.int_attribute("/", "format_version") != 1) {
    throw InputError(reader.path() + ": golden format_version " +
                     std::to_string(reader.int_attribute("/", "format_version")) +
                     " is not supported (1 is)");
  }
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(reader.string_attribute("/", "config"));
  } catch (const nlohmann::json::exception&) {
    throw InputError(reader.path() + ": root attribute config is not valid JSON");
  }
  Config config = resolve_config(json, {}, reader.path() + " (attribute config)");
  config.parallel = ParallelConfig{};
  return config;
}

}  // namespace

GoldenReader::GoldenReader(const std::string& path)
    : reader_(path), config_(stored_config(reader_)), table_(config_.model) {
  if (reader_.exists("/steps")) {
    for (const std::string& name : reader_.children("/steps")) {
      char* end = nullptr;
      const long long step = std::strtoll(name.c_str(), &end, 10);
      if (end && *end == '\0' && step > 0) steps_.push_back(step);
    }
  }
  std::sort(steps_.begin(), steps_.end());
  if (steps_.empty()) throw InputError(path + ": the golden file records no steps");
}

Recorded GoldenReader::read(const std::string& path) const {
  const std::string object = "/" + path;
  Recorded r{reader_.shape(object), reader_.read_f64(object), reader_.element_type(object)};
  for (double v : r.values) {
    if (!std::isfinite(v)) {
      throw InputError(reader_.path() + ": golden dataset " + object + " holds a non-finite value");
    }
  }
  return r;
}

GlobalBatch GoldenReader::batch(int64_t step) const {
  const std::vector<int64_t> shape = reader_.shape("/batch/tokens");
  if (shape.size() != 3 || step < 1 || step > shape[0]) {
    throw InputError(reader_.path() + ": /batch/tokens holds no batch for step " + std::to_string(step));
  }
  const int64_t B = shape[1], T = shape[2];
  const auto offset = static_cast<std::ptrdiff_t>((step - 1) * B * T);
  auto rows = [&](const char* name) {
    const std::string object = std::string("/batch/") + name;
    if (reader_.shape(object) != shape) {
      throw InputError(reader_.path() + ": " + object + " has another shape");
    }
    const std::vector<int32_t> all = reader_.read_i32(object);
    return std::vector<int32_t>(all.begin() + offset, all.begin() + offset + B * T);
  };
  GlobalBatch batch;
  batch.windows = B;
  batch.seq = T;
  for (int64_t i = 0; i < B; ++i) batch.sample_indices.push_back((step - 1) * B + i);
  batch.tokens = rows("tokens");
  batch.targets = rows("targets");
  batch.position_ids = rows("position_ids");
  batch.document_ids = rows("document_ids");
  return batch;
}

std::vector<std::string> GoldenReader::step_datasets(int64_t step) const {
  return reader_.datasets_below("/steps/" + std::to_string(step));
}

std::string GoldenReader::params_before(int64_t step) const {
  return step <= 1 ? "/params/init" : "/steps/" + std::to_string(step - 1) + "/params";
}

}  // namespace touchstone
