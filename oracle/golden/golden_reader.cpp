// Golden-file access for the diff: format checks, config, datasets and batches.
#include "oracle/golden/golden_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
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
  std::error_code error;
  file_bytes_ = std::filesystem::file_size(path, error);
  if (reader_.exists("/steps")) {
    for (const std::string& name : reader_.children("/steps")) {
      char* end = nullptr;
      const long long step = std::strtoll(name.c_str(), &end, 10);
      if (end && *end == '\0' && step > 0 && std::isdigit(static_cast<unsigned char>(name[0]))) {
        steps_.push_back(step);
      } else {
        notes_.push_back("ignored golden group /steps/" + name + " (not a step number)");
      }
    }
  }
  std::sort(steps_.begin(), steps_.end());
  if (steps_.empty()) throw InputError(path + ": the golden file records no steps");
}

std::vector<int64_t> GoldenReader::checked_shape(const std::string& object) const {
  const std::vector<int64_t> shape = reader_.shape(object);
  const int param = table_.find(object.substr(object.rfind('/') + 1));
  if (param >= 0 && shape != table_[param].shape) {
    throw InputError(reader_.path() + ": " + object + " has shape " + shape_text(shape) +
                     ", the model's is " + shape_text(table_[param].shape));
  }
  const std::string type = reader_.element_type(object);
  const size_t digits = type.find_first_of("0123456789");
  const int64_t element_bits = digits == std::string::npos ? 64 : std::stoll(type.substr(digits));
  const auto declared = static_cast<double>(checked_numel(shape, reader_.path() + ": " + object)) *
                        static_cast<double>(element_bits / 8);
  if (file_bytes_ > 0 && declared > static_cast<double>(file_bytes_)) {
    throw InputError(reader_.path() + ": " + object + " declares shape " + shape_text(shape) + " (" +
                     std::to_string(static_cast<uintmax_t>(declared)) + " bytes) but the file holds " +
                     std::to_string(file_bytes_) + " bytes");
  }
  return shape;
}

Recorded GoldenReader::read(const std::string& path) const {
  const std::string object = "/" + path;
  Recorded r{checked_shape(object), reader_.read_f64(object), reader_.element_type(object)};
  for (double v : r.values) {
    if (!std::isfinite(v)) {
      throw InputError(reader_.path() + ": golden dataset " + object + " holds a non-finite value");
    }
  }
  return r;
}

GlobalBatch GoldenReader::batch(int64_t step) const {
  const std::vector<int64_t> shape = checked_shape("/batch/tokens");
  if (shape.size() != 3 || step < 1 || step > shape[0] || shape[1] != config_.train.global_batch_size ||
      shape[2] != config_.model.seq_length) {
    throw InputError(reader_.path() + ": /batch/tokens holds no batch for step " + std::to_string(step));
  }
  const int64_t B = shape[1], T = shape[2];
  const auto offset = static_cast<std::ptrdiff_t>((step - 1) * B * T);
  auto rows = [&](const char* name) {
    const std::string object = std::string("/batch/") + name;
    if (checked_shape(object) != shape) {
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
