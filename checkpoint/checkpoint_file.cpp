// Writing and verifying checkpoint files (docs/checkpoints.md).
#include "checkpoint/checkpoint_file.h"

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_store.h"
#include "common/errors.h"
#include "common/hash.h"
#include "common/version.h"
#include "optim/optimizer.h"

namespace touchstone {

namespace {

constexpr const char* kFormat = "touchstone-checkpoint";
constexpr int64_t kFormatVersion = 1;
constexpr const char* kChecksum = "fnv1a64";
constexpr const char* kDataFingerprint = "data_fingerprint";

nlohmann::json layout_json(const Config& config) {
  const ParallelConfig& p = config.parallel;
  return {{"tp", p.tp},
          {"cp", p.cp},
          {"pp", p.pp},
          {"dp", p.dp},
          {"world_size", p.world_size()},
          {"sequence_parallel", p.sequence_parallel},
          {"distributed_optimizer", p.distributed_optimizer},
          {"zero_stage", p.zero_stage},
          {"schedule", p.schedule}};
}

// "section.key" -> value for every leaf of a config's JSON.
void flatten(const nlohmann::json& json, const std::string& prefix,
             std::map<std::string, nlohmann::json>& out) {
  if (!json.is_object()) {
    out[prefix] = json;
    return;
  }
  for (const auto& [key, value] : json.items())
    flatten(value, prefix.empty() ? key : prefix + "." + key, out);
}

bool may_differ_on_resume(const std::string& key, const Config& current) {
  if (key.rfind("parallel.", 0) == 0 || key.rfind("envelope.", 0) == 0 || key == "train.steps") return true;
  // The same objective with other micro-batches only under the global token mean.
  return key == "train.micro_batch_size" &&
         current.train.loss_normalization == LossNormalization::kGlobalTokenMean;
}

// Reads a dataset's values and verifies its checksum against the bytes read.
class VerifyingReader {
 public:
  explicit VerifyingReader(const std::string& path) : reader_(path) {}

  const h5::H5Reader& reader() const { return reader_; }

  std::vector<double> read_f64(const std::string& dataset, const std::vector<int64_t>& expected_shape) const {
    require(dataset);
    const std::vector<int64_t> shape = reader_.shape(dataset);
    if (shape != expected_shape) {
      throw InputError(reader_.path() + ": " + dataset + " has shape " + shape_text(shape) +
                       ", the model needs " + shape_text(expected_shape));
    }
    if (reader_.element_type(dataset) != "float64") {
      throw InputError(reader_.path() + ": " + dataset + " is " + reader_.element_type(dataset) +
                       ", not float64");
    }
    std::vector<double> values = reader_.read_f64(dataset);
    verify(dataset, values.data(), values.size() * sizeof(double));
    return values;
  }

  int64_t read_scalar_i64(const std::string& dataset) const {
    require(dataset);
    const std::vector<int64_t> values = reader_.read_i64(dataset);
    if (values.size() != 1) throw InputError(reader_.path() + ": " + dataset + " is not a scalar");
    verify(dataset, values.data(), sizeof(int64_t));
    return values[0];
  }

  double read_scalar_f64(const std::string& dataset) const {
    const std::vector<double> values = read_f64(dataset, {});
    return values[0];
  }

 private:
  void require(const std::string& dataset) const {
    if (!reader_.exists(dataset)) throw InputError(reader_.path() + ": missing " + dataset);
  }
  void verify(const std::string& dataset, const void* data, size_t bytes) const {
    if (!reader_.has_attribute(dataset, kChecksum)) {
      throw InputError(reader_.path() + ": " + dataset + " has no checksum");
    }
    const std::string stored = reader_.string_attribute(dataset, kChecksum);
    const std::string actual = hex64(fnv1a64(data, bytes));
    if (stored != actual) {
      throw InputError(reader_.path() + ": " + dataset + " is corrupted (checksum " + actual +
                       ", written as " + stored + ")");
    }
  }
  static std::string shape_text(const std::vector<int64_t>& shape) {
    std::string text = "[";
    for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
    return text + "]";
  }

  h5::H5Reader reader_;
};

ParamTensors read_tensors(const VerifyingReader& file, const std::string& group, const ParamTable& table) {
  const h5::H5Reader& reader = file.reader();
  if (!reader.exists(group) || !reader.is_group(group))
    throw InputError(reader.path() + ": missing " + group);
  for (const std::string& name : reader.children(group)) {
    if (table.find(name) < 0) {
      throw InputError(reader.path() + ": " + group + "/" + name + " is not a parameter of this model");
    }
  }
  ParamTensors tensors;
  for (const ParamSpec& spec : table.specs()) {
    tensors.tensors.push_back(file.read_f64(group + "/" + spec.name, spec.shape));
  }
  return tensors;
}

}  // namespace

CheckpointFileWriter::CheckpointFileWriter(const std::string& path, const Config& config) : path_(path) {
  try {
    writer_.emplace(path);
    writer_->set_attribute("/", "format", std::string(kFormat));
    writer_->set_attribute("/", "format_version", kFormatVersion);
    writer_->set_attribute("/", "config", to_json(config).dump());
    writer_->set_attribute("/", "layout", layout_json(config).dump());
    writer_->set_attribute("/", "precision", option_name(config.precision));
    writer_->set_attribute("/", "generator", generator_string());
  } catch (...) {
    writer_.reset();
    CheckpointStore::abandon_save_of(path_);
    throw;
  }
}

CheckpointFileWriter::~CheckpointFileWriter() {
  if (committed_) return;
  writer_.reset();  // removes the temporary file
  CheckpointStore::abandon_save_of(path_);
}

void CheckpointFileWriter::checksum(const std::string& path, const void* data, size_t bytes) {
  writer_->set_attribute(path, kChecksum, hex64(fnv1a64(data, bytes)));
}

void CheckpointFileWriter::write_progress(const Config& config, const TrainingState& state) {
  const auto scalar_i64 = [&](const std::string& path, int64_t value) {
    writer_->write_scalar_i64(path, value);
    checksum(path, &value, sizeof value);
  };
  const auto scalar_f64 = [&](const std::string& path, double value) {
    writer_->write_scalar_f64(path, value);
    checksum(path, &value, sizeof value);
  };
  if (!state.data_fingerprint.empty()) writer_->set_attribute("/", kDataFingerprint, state.data_fingerprint);
  scalar_i64("/state/step", state.step);
  scalar_i64("/state/consumed_samples", state.consumed_samples);
  scalar_i64("/state/next_sample_index", state.consumed_samples);
  scalar_f64("/scheduler/lr", state.lr);
  scalar_i64("/rng/seed", config.train.seed);
  writer_->set_attribute("/rng/seed", "algorithm", std::string("philox4x32-10"));
  writer_->set_attribute(
      "/rng/seed", "keyed_by",
      std::string("(seed, stream name, global element or sample index): no state beyond the seed "
                  "and /state/next_sample_index"));
}

void CheckpointFileWriter::write_tensors(const std::string& group, const ParamTable& table,
                                         const ParamTensors& tensors) {
  for (int id = 0; id < table.size(); ++id) {
    const std::string path = group + "/" + table[id].name;
    writer_->write_f64(path, tensors[id].data(), table[id].shape);
    checksum(path, tensors[id].data(), tensors[id].size() * sizeof(double));
  }
}

void CheckpointFileWriter::commit() {
  writer_->commit();
  committed_ = true;
}

Config checkpoint_config(const std::string& path) {
  const h5::H5Reader reader(path);
  if (!reader.has_attribute("/", "format") || reader.string_attribute("/", "format") != kFormat) {
    throw InputError(path + ": not a Touchstone checkpoint (root attribute format is not \"" +
                     std::string(kFormat) + "\")");
  }
  const int64_t version = reader.int_attribute("/", "format_version");
  if (version != kFormatVersion) {
    throw InputError(path + ": checkpoint format_version " + std::to_string(version) + ", this build reads " +
                     std::to_string(kFormatVersion));
  }
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(reader.string_attribute("/", "config"));
  } catch (const nlohmann::json::exception&) {
    throw InputError(path + ": the config attribute is not valid JSON");
  }
  return resolve_config(json, {}, path + " (config attribute)");
}

void check_resume_compatible(const Config& saved, const Config& current, const std::string& origin) {
  std::map<std::string, nlohmann::json> before, now;
  flatten(to_json(saved), "", before);
  flatten(to_json(current), "", now);
  for (const auto& [key, value] : now) {
    if (may_differ_on_resume(key, current)) continue;
    const auto it = before.find(key);
    if (it == before.end() || it->second != value) {
      throw InputError(origin + ": " + key + " is " + (it == before.end() ? "absent" : it->second.dump()) +
                       " in the checkpoint and " + value.dump() +
                       " in this run; a resumed run must continue the same model, data and optimizer");
    }
  }
}

TrainingState read_checkpoint_file(const std::string& path, const Config& config) {
  check_resume_compatible(checkpoint_config(path), config, path);
  const VerifyingReader file(path);
  const ParamTable table(config.model);
  TrainingState state;
  if (file.reader().has_attribute("/", kDataFingerprint)) {
    state.data_fingerprint = file.reader().string_attribute("/", kDataFingerprint);
  }
  state.step = file.read_scalar_i64("/state/step");
  state.consumed_samples = file.read_scalar_i64("/state/consumed_samples");
  if (file.read_scalar_i64("/state/next_sample_index") != state.consumed_samples ||
      state.consumed_samples != state.step * config.train.global_batch_size) {
    throw InputError(path + ": /state/consumed_samples " + std::to_string(state.consumed_samples) +
                     " is not step x train.global_batch_size");
  }
  state.lr = file.read_scalar_f64("/scheduler/lr");
  // The schedule is a function of the update number; the stored value proves the two runs agree on it.
  if (state.step > 0 && state.lr != learning_rate(config.optim, state.step)) {
    throw InputError(path + ": /scheduler/lr " + std::to_string(state.lr) +
                     " is not the learning rate of update " + std::to_string(state.step) +
                     " under this run's optim settings");
  }
  if (file.read_scalar_i64("/rng/seed") != config.train.seed) {
    throw InputError(path + ": /rng/seed differs from train.seed");
  }
  state.params = read_tensors(file, "/params", table);
  state.exp_avg = read_tensors(file, "/optimizer/exp_avg", table);
  state.exp_avg_sq = read_tensors(file, "/optimizer/exp_avg_sq", table);
  return state;
}

}  // namespace touchstone
