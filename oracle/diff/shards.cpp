// Reassembling per-rank shards: stage-local names made global, shards placed with place_shard, tied
// embedding copies combined.
#include "oracle/diff/shards.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/errors.h"
#include "parallel/context/load_balanced_split.h"
#include "parallel/tensor/sharding.h"

namespace touchstone::diff {

namespace {

struct Layout {
  int tp = 1, pp = 1, cp = 1;
  std::vector<int64_t> boundaries;  // first layer of every stage, then num_layers
  bool summed_tied_grads = false;
};

int positive_int(const nlohmann::json& json, const char* key, const std::string& where) {
  if (!json[key].is_number_integer() || json[key].get<int64_t>() < 1 || json[key].get<int64_t>() > 4096) {
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
  for (const char* key : {"tp", "pp"}) {
    if (!json.contains(key)) throw InputError(where + ": \"" + key + "\" must be an integer >= 1");
  }
  layout.tp = positive_int(json, "tp", where);
  layout.pp = positive_int(json, "pp", where);
  if (json.contains("cp")) layout.cp = positive_int(json, "cp", where);
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
  config.parallel.cp = layout.cp;
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
    validate_config(config, static_cast<int>(config.parallel.world_size()));
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

std::string rank_file(const std::string& directory, const Layout& layout, int t, int c, int p) {
  return directory + "/rank_tp" + std::to_string(t) + (layout.cp > 1 ? "_cp" + std::to_string(c) : "") +
         "_pp" + std::to_string(p) + ".h5";
}

// group -> {table id, copy} -> tp rank -> shard
using ShardKey = std::pair<int, int>;
using ShardSet = std::map<std::string, std::map<ShardKey, std::map<int, Recorded>>>;
using Held = std::set<std::pair<std::string, ShardKey>>;  // {group, key} of the tensors one rank holds

// The cp copy of a shard against cp rank 0's: bitwise equal, since parameters and gradients are
// replicated over cp once the gradients are reduced over dp x cp (every rank ends an all-reduce with the
// same bits). A difference is the candidate's (replica_disagreements), not bad input.
void check_replica(const Recorded& copy, const Recorded& first, const std::string& tensor, int c, int t,
                   int p, Candidate& candidate) {
  if (copy.dtype == first.dtype &&
      std::memcmp(copy.values.data(), first.values.data(), copy.values.size() * sizeof(double)) == 0) {
    return;
  }
  double largest = 0;
  for (size_t i = 0; i < copy.values.size(); ++i) {
    const double d = std::fabs(copy.values[i] - first.values[i]);
    if (std::isnan(d) || d > largest) largest = d;
  }
  std::ostringstream by;
  by << std::setprecision(3) << largest;
  candidate.replica_disagreements.push_back(
      tensor + ": cp rank " + std::to_string(c) + "'s copy (tp rank " + std::to_string(t) + ", stage " +
      std::to_string(p) + ") differs from cp rank 0's" +
      (copy.dtype != first.dtype ? " in stored type (" + copy.dtype + " against " + first.dtype + ")"
                                 : " by up to " + by.str()));
}

// Token losses of each cp rank's rows, [B, T/cp] in the rows' order (LoadBalancedSplit), put back at their
// positions: [B, T]. A copy that already holds the whole window ([B, T]) is cp rank 0's as it is.
void place_token_losses(const std::string& dataset, const std::vector<Recorded>& ranks, int64_t seq,
                        Candidate& candidate) {
  const int cp = static_cast<int>(ranks.size());
  const Recorded& first = ranks.front();
  if (first.shape.size() != 2 || first.shape[1] != seq / cp) {
    candidate.tensors[dataset] = first;
    return;
  }
  const LoadBalancedSplit split(seq, cp);
  const int64_t windows = first.shape[0], local = split.local_seq();
  Recorded whole{{windows, seq}, std::vector<double>(static_cast<size_t>(windows * seq)), first.dtype};
  for (int c = 0; c < cp; ++c) {
    const Recorded& part = ranks[static_cast<size_t>(c)];
    if (part.shape != first.shape) {
      throw InputError(dataset + ": cp rank " + std::to_string(c) + " holds shape " + shape_text(part.shape) +
                       ", cp rank 0 " + shape_text(first.shape) + " (each cp rank's rows, [B, T/cp])");
    }
    const std::vector<int32_t> positions = split.positions(c);
    for (int64_t w = 0; w < windows; ++w) {
      for (int64_t j = 0; j < local; ++j) {
        whole.values[static_cast<size_t>(w * seq + positions[static_cast<size_t>(j)])] =
            part.values[static_cast<size_t>(w * local + j)];
      }
    }
  }
  candidate.tensors[dataset] = std::move(whole);
}

// Reads every rank file: parameter shards into `shards` (cp rank 0's; the other cp ranks' copies are
// checked against them), everything else (scalars, token losses) straight into the candidate.
ShardSet read_ranks(const std::string& directory, const Layout& layout, const GoldenReader& golden,
                    Candidate& candidate) {
  const ParamTable& table = golden.table();
  ShardSet shards;
  std::map<std::string, std::vector<Recorded>> token_losses;  // dataset -> cp rank -> the rank's rows
  std::map<std::pair<int, int>, Held> first_held;             // (stage, tp rank) -> cp rank 0's tensors
  for (int p = 0; p < layout.pp; ++p) {
    for (int c = 0; c < layout.cp; ++c) {
      for (int t = 0; t < layout.tp; ++t) {
        const std::string path = rank_file(directory, layout, t, c, p);
        if (!std::filesystem::exists(path)) {
          throw InputError(path + ": missing (shards.json lists tp x cp x pp ranks)");
        }
        const h5::H5Reader file(path);
        if (candidate.generator.empty() && file.has_attribute("/", "generator")) {
          candidate.generator = file.string_attribute("/", "generator");
        }
        Held held;  // the parameter tensors this rank holds
        for (const std::string& dataset : file.datasets_below("/")) {
          const size_t slash = dataset.rfind('/');
          const std::string group = slash == std::string::npos ? "" : dataset.substr(0, slash);
          const std::string name = dataset.substr(slash + 1);
          const bool loss_rank = t == 0 && p == layout.pp - 1;
          if (!is_parameter_name(name)) {
            if (name == "token_losses" && loss_rank && layout.cp > 1) {
              token_losses[dataset].push_back(read_recorded(file, dataset));
            } else if (c > 0) {
              continue;  // cp rank 0's scalars are the candidate's
            } else if (loss_rank) {
              // The last stage's tp rank 0 computes the loss; its copy wins over any other.
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
          held.insert({group, key});
          if (c == 0) {
            shards[group][key][t] = std::move(shard);
            continue;
          }
          if (!first_held[{p, t}].count({group, key})) {
            throw InputError(path + ": " + dataset +
                             " is not on cp rank 0 (parameters and gradients are "
                             "replicated over cp: every cp rank holds the same tensors)");
          }
          check_replica(
              shard, shards[group][key][t],
              group + "/" + table[key.first].name + (key.second == 1 ? " (the last stage's tied copy)" : ""),
              c, t, p, candidate);
        }
        if (c == 0) {
          first_held[{p, t}] = held;
          continue;
        }
        for (const auto& [group, key] : first_held[{p, t}]) {
          if (!held.count({group, key})) {
            throw InputError(path + ": lacks " + group + "/" + table[key.first].name +
                             ", which cp rank 0 holds (every cp rank holds the same tensors)");
          }
        }
      }
    }
  }
  for (const auto& [dataset, ranks] : token_losses) {
    if (static_cast<int>(ranks.size()) != layout.cp) {
      throw InputError(directory + ": " + dataset + " is on " + std::to_string(ranks.size()) + " of the " +
                       std::to_string(layout.cp) + " cp ranks of the last stage's tp rank 0");
    }
    place_token_losses(dataset, ranks, golden.config().model.seq_length, candidate);
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
  candidate.format = "shards (tp " + std::to_string(layout.tp) +
                     (layout.cp > 1 ? ", cp " + std::to_string(layout.cp) : "") + ", pp " +
                     std::to_string(layout.pp) + ")";
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
