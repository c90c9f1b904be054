// Reassembling per-rank shards: stage-local names made global, shards placed with place_shard, tied
// embedding copies combined.
#include "oracle/diff/shards.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "parallel/tensor/sharding.h"

namespace touchstone::diff {

namespace {

struct Layout {
  int tp = 1, pp = 1;
  std::vector<int64_t> boundaries;  // first layer of every stage, then num_layers
  bool summed_tied_grads = false;
};

int positive_int(const nlohmann::json& json, const char* key, const std::string& where) {
  if (!json.contains(key) || !json[key].is_number_integer() || json[key].get<int64_t>() < 1 ||
      json[key].get<int64_t>() > 4096) {
    throw InputError(where + ": \"" + key + "\" must be an integer >= 1");
  }
  return static_cast<int>(json[key].get<int64_t>());
}

Layout read_layout(const std::string& directory, const GoldenReader& golden) {
  const std::string where = directory + "/shards.json";
  std::ifstream in(where);
  if (!in) throw InputError(where + ": cannot open");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    throw InputError(where + ": not valid JSON");
  }
  auto text = [&](const char* key, const std::string& fallback) {
    if (!json.contains(key)) return fallback;
    if (!json[key].is_string()) throw InputError(where + ": \"" + key + "\" must be a string");
    return json[key].get<std::string>();
  };
  if (!json.is_object() || text("format", "") != "touchstone-shards" || !json.contains("format_version") ||
      json["format_version"] != 1) {
    throw InputError(where + ": expected {\"format\": \"touchstone-shards\", \"format_version\": 1, ...}");
  }
  Layout layout;
  layout.tp = positive_int(json, "tp", where);
  layout.pp = positive_int(json, "pp", where);
  Config config = golden.config();
  if (json.contains("tie_embeddings") &&
      (!json["tie_embeddings"].is_boolean() ||
       json["tie_embeddings"].get<bool>() != config.model.tie_embeddings)) {
    throw InputError(where + ": tie_embeddings disagrees with the golden model (model.tie_embeddings = " +
                     (config.model.tie_embeddings ? "true" : "false") + ")");
  }
  const std::string tied = text("tied_embedding_grads", "partial");
  if (tied != "partial" && tied != "summed") {
    throw InputError(where + ": tied_embedding_grads must be partial or summed");
  }
  layout.summed_tied_grads = tied == "summed";
  config.parallel.tp = layout.tp;
  config.parallel.pp = layout.pp;
  // The candidate's stages are those shards.json describes, whatever layout produced the golden file:
  // equal stages unless it lists them, and one model chunk per stage (docs/diffing.md).
  config.parallel.virtual_stages = 1;
  config.parallel.stage_layers.clear();
  config.parallel.dp = 1;
  config.train.micro_batch_size = 1;  // the batch plays no part in where tensors live
  try {
    if (json.contains("stage_layers")) {
      config.parallel.stage_layers = json["stage_layers"].get<std::vector<int64_t>>();
    }
    validate_config(config, layout.tp * layout.pp);
  } catch (const nlohmann::json::exception&) {
    throw InputError(where + ": stage_layers must be a list of integers");
  } catch (const InputError& e) {
    throw InputError(where + ": this layout does not fit the golden model: " + e.what());
  }
  layout.boundaries = config.stage_boundaries();
  return layout;
}

bool is_parameter_name(const std::string& name) {
  return name.rfind("decoder.", 0) == 0 || name.rfind("embedding.", 0) == 0 ||
         name.rfind("output_layer.", 0) == 0;
}

// A stage-local parameter name -> {table id, copy}: copy 1 is the last stage's copy of a tied embedding.
std::pair<int, int> global_id(const std::string& local, int stage, const Layout& layout,
                              const ParamTable& table, bool tied, const std::string& where) {
  const std::string layers = "decoder.layers.";
  const bool first = stage == 0, last = stage == layout.pp - 1;
  if (local.rfind(layers, 0) == 0) {
    const size_t dot = local.find('.', layers.size());
    int64_t k = -1;
    try {
      k = std::stoll(local.substr(layers.size(), dot - layers.size()));
    } catch (const std::exception&) {
    }
    const int64_t l = layout.boundaries[static_cast<size_t>(stage)] + k;
    if (dot == std::string::npos || k < 0 || l >= layout.boundaries[static_cast<size_t>(stage) + 1]) {
      throw InputError(where + ": " + local + " is not a layer of pipeline stage " + std::to_string(stage) +
                       " (layer numbers are local to the stage)");
    }
    const int id = table.find(layers + std::to_string(l) + local.substr(dot));
    if (id < 0) throw InputError(where + ": " + local + " is not a parameter of the golden model");
    return {id, 0};
  }
  const int id = table.find(local);
  if (tied && local == "output_layer.weight" && last && !first) return {table.embedding(), 1};
  const bool placed = (local == "embedding.word_embeddings.weight" && first) ||
                      (local == "decoder.final_layernorm.weight" && last) ||
                      (local == "output_layer.weight" && last && !tied);
  if (id < 0 || !placed) {
    throw InputError(where + ": " + local + " does not belong on pipeline stage " + std::to_string(stage));
  }
  return {id, 0};
}

std::string rank_file(const std::string& directory, int t, int p) {
  return directory + "/rank_tp" + std::to_string(t) + "_pp" + std::to_string(p) + ".h5";
}

// group -> {table id, copy} -> tp rank -> shard
using ShardSet = std::map<std::string, std::map<std::pair<int, int>, std::map<int, Recorded>>>;

// Reads every rank file: parameter shards into `shards`, everything else (scalars, token losses)
// straight into the candidate.
ShardSet read_ranks(const std::string& directory, const Layout& layout, const GoldenReader& golden,
                    Candidate& candidate) {
  const ParamTable& table = golden.table();
  ShardSet shards;
  for (int p = 0; p < layout.pp; ++p) {
    for (int t = 0; t < layout.tp; ++t) {
      const std::string path = rank_file(directory, t, p);
      if (!std::filesystem::exists(path))
        throw InputError(path + ": missing (shards.json lists tp x pp ranks)");
      const h5::H5Reader file(path);
      if (candidate.generator.empty() && file.has_attribute("/", "generator")) {
        candidate.generator = file.string_attribute("/", "generator");
      }
      for (const std::string& dataset : file.datasets_below("/")) {
        const size_t slash = dataset.rfind('/');
        const std::string group = slash == std::string::npos ? "" : dataset.substr(0, slash);
        const std::string name = dataset.substr(slash + 1);
        if (!is_parameter_name(name)) {
          // The last stage's tp rank 0 computes the loss; its copy wins over any other.
          if (t == 0 && p == layout.pp - 1) {
            candidate.tensors[dataset] = read_recorded(file, dataset);
          } else {
            candidate.tensors.emplace(dataset, read_recorded(file, dataset));
          }
          continue;
        }
        const auto key =
            global_id(name, p, layout, table, golden.config().model.tie_embeddings, path + ": " + group);
        const std::vector<int64_t> expected =
            shard_shape(table[key.first].sharding, table[key.first].shape, layout.tp);
        Recorded shard = read_recorded(file, dataset);
        if (shard.shape != expected) {
          throw InputError(path + ": " + dataset + " has shape " + shape_text(shard.shape) + ", a tp " +
                           std::to_string(layout.tp) + " shard of " + table[key.first].name + " is " +
                           shape_text(expected));
        }
        shards[group][key][t] = std::move(shard);
      }
    }
  }
  return shards;
}

// The full tensor from the shards of every tp rank.
Recorded place_all(const std::string& directory, const std::string& group, const ParamSpec& spec,
                   bool tied_copy, const std::map<int, Recorded>& ranks, int tp) {
  for (int t = 0; t < tp; ++t) {
    if (!ranks.count(t)) {
      throw InputError(directory + ": tp rank " + std::to_string(t) + " lacks " + group + "/" + spec.name +
                       (tied_copy ? " (the last stage's tied copy)" : "") + ", which other tp ranks hold");
    }
  }
  // Every shard of a tensor in one stored type (a 16-bit copy's type comes from stored_dtype).
  for (int t = 1; t < tp; ++t) {
    if (ranks.at(t).dtype != ranks.at(0).dtype) {
      throw InputError(directory + ": " + group + "/" + spec.name +
                       (tied_copy ? " (the last stage's tied copy)" : "") + " is " + ranks.at(0).dtype +
                       " on tp rank 0 and " + ranks.at(t).dtype + " on tp rank " + std::to_string(t));
    }
  }
  Recorded full{spec.shape, std::vector<double>(static_cast<size_t>(spec.numel())), ranks.at(0).dtype};
  for (int t = 0; t < tp; ++t) {
    // A replicated tensor is whole on every tp rank; rank 0's copy is the one counted.
    if (spec.sharding == Sharding::kReplicated && t > 0) break;
    place_shard(spec.sharding, spec.shape, ranks.at(t).values, t, tp, full.values);
  }
  return full;
}

}  // namespace

Candidate load_shards(const std::string& directory, const GoldenReader& golden) {
  const Layout layout = read_layout(directory, golden);
  const ParamTable& table = golden.table();
  Candidate candidate;
  candidate.format = "shards (tp " + std::to_string(layout.tp) + ", pp " + std::to_string(layout.pp) + ")";
  const bool split_tied_grads =
      golden.config().model.tie_embeddings && layout.pp > 1 && !layout.summed_tied_grads;
  for (const auto& [group, tensors] : read_ranks(directory, layout, golden, candidate)) {
    std::map<int, std::map<int, Recorded>> copies;  // id -> copy -> full tensor
    for (const auto& [key, ranks] : tensors) {
      copies[key.first][key.second] =
          place_all(directory, group, table[key.first], key.second == 1, ranks, layout.tp);
    }
    const bool grads = group.size() >= 6 && group.compare(group.size() - 6, 6, "/grads") == 0;
    for (auto& [id, by_copy] : copies) {
      const std::string path = group + "/" + table[id].name;
      if (!by_copy.count(0)) {
        throw InputError(directory + ": " + path +
                         " is on the last stage only; the first stage's copy is missing");
      }
      // Each stage's part of a tied embedding's gradient: the sum is the gradient. Otherwise the copies
      // are equal and the first stage's is the one counted.
      if (grads && split_tied_grads && id == table.embedding()) {
        if (!by_copy.count(1)) {
          throw InputError(directory + ": " + path +
                           ": the last stage's part of the tied embedding gradient (output_layer.weight) is "
                           "missing; it is needed with tied_embedding_grads \"partial\"");
        }
        for (size_t i = 0; i < by_copy[0].values.size(); ++i) by_copy[0].values[i] += by_copy[1].values[i];
      }
      candidate.tensors[path] = std::move(by_copy[0]);
    }
  }
  return candidate;
}

}  // namespace touchstone::diff
