// The Hugging Face export: config.json from the golden config, model.safetensors streamed from the
// golden parameters one tensor at a time (q/k/v split per KV group, gate/up split, renames).
#include "oracle/hf/export.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <span>
#include <vector>

#include "common/errors.h"
#include "common/published_directory.h"
#include "common/text_output.h"
#include "oracle/golden/golden_reader.h"
#include "oracle/hf/hf_names.h"
#include "oracle/hf/safetensors.h"

namespace touchstone::hf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigFile = "config.json";
constexpr const char* kModelFile = "model.safetensors";

void check_writable(const std::string& where, const fs::path& directory) {
  // access() also answers EROFS for a read-only file system, which a root process meets too.
  if (::access(directory.c_str(), W_OK | X_OK) != 0) {
    throw InputError(where + ": cannot write in directory " + directory.string() + " (" +
                     std::strerror(errno) + ")");
  }
}

// The golden group of the parameters after update `step`, checked against the steps the file records.
std::string params_group(const GoldenReader& golden, int64_t step) {
  if (step == 0) return "params/init";
  const std::vector<int64_t>& steps = golden.steps();
  for (int64_t recorded : steps) {
    if (recorded == step) return "steps/" + std::to_string(step) + "/params";
  }
  throw InputError(golden.path() + " records no step " + std::to_string(step) + " (it records steps " +
                   std::to_string(steps.front()) + " to " + std::to_string(steps.back()) +
                   "; step 0 is /params/init)");
}

// One golden dataset and the HF tensors it becomes.
struct Source {
  std::string name;     // contract name
  std::string dataset;  // "params/init/<name>"
  std::vector<HfPart> parts;
};

// Streams every source into `writer`, one golden tensor in memory at a time.
void write_tensors(const GoldenReader& golden, const std::vector<Source>& sources,
                   SafetensorsWriter& writer) {
  for (const Source& source : sources) {
    const std::vector<double> values =
        hf_layout(source.name, golden.config().model, golden.read(source.dataset).values);
    for (const HfPart& part : source.parts) {
      writer.write(std::span<const double>(values).subspan(static_cast<size_t>(part.offset),
                                                           static_cast<size_t>(part.numel())));
    }
  }
}

}  // namespace

nlohmann::json llama_config(const Config& config) {
  const ModelConfig& m = config.model;
  nlohmann::json json = {
      {"model_type", "llama"},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.hidden_size},
      {"intermediate_size", m.ffn_hidden_size},
      {"num_hidden_layers", m.num_layers},
      {"num_attention_heads", m.num_heads},
      {"num_key_value_heads", m.num_kv_heads},
      {"head_dim", m.head_dim()},
      {"max_position_embeddings", m.seq_length},
      {"rms_norm_eps", m.norm_eps},
      {"rope_theta", m.rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", m.tie_embeddings},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
      {"initializer_range", m.init_std},
      {"pretraining_tp", 1},
      {"use_cache", false},
      {"bos_token_id", nullptr},
      {"eos_token_id", config.data.eos_token},
      {"pad_token_id", config.data.pad_token},
      {"torch_dtype", config.precision == Precision::kFp64 ? "float64" : "float32"},
  };
  json["architectures"] = nlohmann::json::array({"LlamaForCausalLM"});
  return json;
}

void check_expressible(const Config& config, const std::string& where) {
  if (config.model.hidden_dropout > 0) {
    throw InputError(where + ": model.hidden_dropout is " +
                     nlohmann::json(config.model.hidden_dropout).dump() +
                     ", and Hugging Face's Llama has no hidden dropout");
  }
  if (config.model.attention_dropout > 0) {
    throw InputError(where + ": model.attention_dropout is " +
                     nlohmann::json(config.model.attention_dropout).dump() +
                     ": Touchstone's dropout masks come from its own counter-based RNG, which no Hugging "
                     "Face run reproduces");
  }
}

void check_export_directory(const std::string& dir, const std::string& option) {
  const std::string where = option.empty() ? dir : option + " " + dir;
  if (dir.empty()) throw InputError((option.empty() ? "export directory" : option) + " '': empty path");
  const fs::path directory = directory_path(dir);
  struct stat status {};
  if (::lstat(directory.c_str(), &status) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) {
      throw InputError(where + ": cannot be examined (" + std::string(std::strerror(errno)) + ")");
    }
    const fs::path parent = directory.parent_path();
    std::error_code error;
    if (!fs::exists(parent, error)) {
      throw InputError(where + ": directory " + parent.string() +
                       " does not exist (only the last directory of the path is created)");
    }
    if (!fs::is_directory(parent, error))
      throw InputError(where + ": " + parent.string() + " is not a directory");
    check_writable(where, parent);
    return;
  }
  if (S_ISLNK(status.st_mode)) throw InputError(where + ": is a symbolic link (give the directory itself)");
  if (!S_ISDIR(status.st_mode)) throw InputError(where + ": is not a directory");
  check_writable(where, directory);
  for (const char* name : {kConfigFile, kModelFile}) {
    const std::string inside = (fs::path(dir) / name).string();
    try {
      check_replaceable(inside);
    } catch (const InputError& e) {
      throw InputError(option.empty() ? e.what() : option + " " + e.what());
    }
  }
  check_publishable_directory(dir, where);
}

ExportSummary export_hf(const std::string& golden_path, const std::string& dir, int64_t step) {
  if (step < 0) throw InputError("step " + std::to_string(step) + " is not a step (0 is /params/init)");
  check_export_directory(dir, "");
  const GoldenReader golden(golden_path);
  const Config& config = golden.config();
  check_expressible(config, golden_path);
  ExportSummary summary;
  const std::string group = params_group(golden, step);
  summary.group = "/" + group;

  // Every dataset checked and the header planned before anything is read or written.
  const std::string dtype = config.precision == Precision::kFp64 ? "F64" : "F32";
  const std::string element_type = config.precision == Precision::kFp64 ? "float64" : "float32";
  std::vector<Source> sources;
  std::vector<SafetensorsEntry> entries;
  for (const ParamSpec& spec : golden.table().specs()) {
    Source source{spec.name, group + "/" + spec.name, hf_parts_of(spec.name, config.model)};
    const std::string object = "/" + source.dataset;
    if (!golden.has(source.dataset)) throw InputError(golden_path + ": " + object + " is missing");
    golden.checked_shape(object);
    const std::string stored = golden.reader().element_type(object);
    if (stored != element_type) {
      throw InputError(golden_path + ": " + object + " is stored as " + stored + ", a " +
                       nlohmann::json(config.precision).get<std::string>() + " golden file stores " +
                       element_type);
    }
    for (const HfPart& part : source.parts) entries.push_back({part.name, dtype, part.shape});
    sources.push_back(std::move(source));
  }
  summary.tensors = static_cast<int64_t>(entries.size());

  // The two files must agree, so they are published as one: written into a fresh directory that then
  // takes the place of `dir` in one system call (common/published_directory.h).
  DirectoryPublication publication(dir, {kConfigFile, kModelFile});
  SafetensorsWriter writer(publication.path_of(kModelFile), entries, {{"format", "pt"}});
  write_tensors(golden, sources, writer);
  summary.bytes = writer.bytes();
  writer.commit();
  write_text_file_atomically(publication.path_of(kConfigFile), llama_config(config).dump(2) + "\n");
  publication.publish();
  return summary;
}

}  // namespace touchstone::hf
