// HF Llama <-> contract names and layouts: the rename tables, the linear_qkv regrouping, and both
// directions of the conversion.
#include "oracle/hf/hf_names.h"

#include <algorithm>
#include <cctype>

#include "common/errors.h"

namespace touchstone::hf {

namespace {

// Names that only change (HF suffix after "model.layers.{i}." -> contract suffix after
// "decoder.layers.{i}."), and the whole-model ones.
const std::map<std::string, std::string> kLayerRenames = {
    {"input_layernorm.weight", "input_layernorm.weight"},
    {"post_attention_layernorm.weight", "pre_mlp_layernorm.weight"},
    {"self_attn.o_proj.weight", "self_attention.linear_proj.weight"},
    {"mlp.down_proj.weight", "mlp.linear_fc2.weight"},
};
const std::map<std::string, std::string> kModelRenames = {
    {"model.embed_tokens.weight", "embedding.word_embeddings.weight"},
    {"model.norm.weight", "decoder.final_layernorm.weight"},
    {"lm_head.weight", "output_layer.weight"},
};
// Parts fused into one contract tensor, in the order they are stacked.
const std::vector<std::string> kQkvParts = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                            "self_attn.v_proj.weight"};
const std::vector<std::string> kFc1Parts = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};

// "model.layers.12.mlp.up_proj.weight" -> {12, "mlp.up_proj.weight"} (with the prefix "decoder.layers.",
// the same for contract names); layer -1 when not a layer name.
std::pair<int64_t, std::string> split_layer(const std::string& name,
                                            const std::string& prefix = "model.layers.") {
  if (name.rfind(prefix, 0) != 0) return {-1, name};
  size_t i = prefix.size(), j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  if (j == i || j >= name.size() || name[j] != '.' || j - i > 9) return {-1, name};
  return {std::stoll(name.substr(i, j - i)), name.substr(j + 1)};
}

// The contract name an HF name is renamed from, for the reverse direction.
std::map<std::string, std::string> reversed(const std::map<std::string, std::string>& renames) {
  std::map<std::string, std::string> out;
  for (const auto& [hf, contract] : renames) out.emplace(contract, hf);
  return out;
}

void expect_shape(const std::string& name, const Recorded& t, const std::vector<int64_t>& shape) {
  if (t.shape != shape) {
    throw InputError("safetensors tensor " + name + " has shape " + shape_text(t.shape) +
                     ", the golden model expects " + shape_text(shape));
  }
}

}  // namespace

std::vector<int64_t> qkv_separate_row_of_grouped(const ModelConfig& m) {
  const int64_t D = m.head_dim(), NH = m.num_heads, NKV = m.num_kv_heads, G = NH / NKV;
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(m.qkv_rows()));
  for (int64_t g = 0; g < NKV; ++g) {
    for (int64_t slot = 0; slot < G + 2; ++slot) {
      const int64_t first =
          slot < G ? (g * G + slot) * D : (slot == G ? NH * D + g * D : (NH + NKV) * D + g * D);
      for (int64_t d = 0; d < D; ++d) rows.push_back(first + d);
    }
  }
  return rows;
}

std::vector<double> qkv_grouped_from_separate(const ModelConfig& model, const std::vector<double>& values,
                                              int64_t cols) {
  const std::vector<int64_t> rows = qkv_separate_row_of_grouped(model);
  std::vector<double> out(values.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy_n(values.begin() + rows[r] * cols, cols, out.begin() + static_cast<int64_t>(r) * cols);
  }
  return out;
}

std::vector<double> qkv_separate_from_grouped(const ModelConfig& model, const std::vector<double>& values,
                                              int64_t cols) {
  const std::vector<int64_t> rows = qkv_separate_row_of_grouped(model);
  std::vector<double> out(values.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy_n(values.begin() + static_cast<int64_t>(r) * cols, cols, out.begin() + rows[r] * cols);
  }
  return out;
}

TensorMap hf_to_contract(const std::map<std::string, Recorded>& tensors, const ModelConfig& m,
                         const std::string& group, std::vector<std::string>& ignored) {
  const int64_t H = m.hidden_size, D = m.head_dim(), F = m.ffn_hidden_size;
  TensorMap out;
  std::map<int64_t, std::map<std::string, const Recorded*>> fused;  // layer -> HF part name -> tensor
  auto put = [&](const std::string& name, Recorded t) {
    if (!out.emplace(group + "/" + name, std::move(t)).second) {
      throw InputError("safetensors: tensor " + name +
                       " is given twice (under its HF and its contract name)");
    }
  };
  for (const auto& [name, tensor] : tensors) {
    const auto [layer, suffix] = split_layer(name);
    if (layer >= m.num_layers) {
      throw InputError("safetensors: " + name + " names layer " + std::to_string(layer) +
                       ", the golden model has " + std::to_string(m.num_layers) + " layers");
    }
    if (layer >= 0) {
      const std::string prefix = "decoder.layers." + std::to_string(layer) + ".";
      if (kLayerRenames.count(suffix)) {
        put(prefix + kLayerRenames.at(suffix), tensor);
        continue;
      }
      if (std::find(kQkvParts.begin(), kQkvParts.end(), suffix) != kQkvParts.end() ||
          std::find(kFc1Parts.begin(), kFc1Parts.end(), suffix) != kFc1Parts.end()) {
        fused[layer][suffix] = &tensor;
        continue;
      }
    }
    if (kModelRenames.count(name)) {
      if (name == "lm_head.weight" && m.tie_embeddings) {
        ignored.push_back(name + " (embeddings are tied: model.embed_tokens.weight holds the tensor)");
        continue;
      }
      put(kModelRenames.at(name), tensor);
    } else if (name.rfind("decoder.", 0) == 0 || name.rfind("embedding.", 0) == 0 ||
               name == "output_layer.weight") {
      put(name, tensor);  // already a contract name
    } else {
      ignored.push_back(name);
    }
  }
  for (const auto& [layer, parts] : fused) {
    const std::string hf = "model.layers." + std::to_string(layer) + ".";
    const std::string prefix = "decoder.layers." + std::to_string(layer) + ".";
    for (const auto& part_names : {kQkvParts, kFc1Parts}) {
      size_t present = 0;
      for (const std::string& p : part_names) present += parts.count(p);
      if (present == 0) continue;
      std::vector<double> stacked;
      std::string dtype;
      for (const std::string& p : part_names) {
        if (!parts.count(p)) {
          throw InputError("safetensors: " + hf + p + " is missing (the other parts are there)");
        }
        const Recorded& t = *parts.at(p);
        const bool is_q = p == kQkvParts[0], is_fc1 = part_names == kFc1Parts;
        expect_shape(hf + p, t, {is_fc1 ? F : (is_q ? m.num_heads : m.num_kv_heads) * D, H});
        stacked.insert(stacked.end(), t.values.begin(), t.values.end());
        dtype = dtype.empty() || dtype == t.dtype ? t.dtype : "mixed";
      }
      if (part_names == kFc1Parts) {
        put(prefix + "mlp.linear_fc1.weight", Recorded{{2 * F, H}, std::move(stacked), dtype});
      } else {
        put(prefix + "self_attention.linear_qkv.weight",
            Recorded{{m.qkv_rows(), H}, qkv_grouped_from_separate(m, stacked, H), dtype});
      }
    }
  }
  return out;
}

int64_t HfPart::numel() const { return checked_numel(shape, name); }

std::vector<HfPart> hf_parts_of(const std::string& contract_name, const ModelConfig& m) {
  static const std::map<std::string, std::string> kLayerFromContract = reversed(kLayerRenames);
  static const std::map<std::string, std::string> kModelFromContract = reversed(kModelRenames);
  const int64_t H = m.hidden_size, D = m.head_dim(), F = m.ffn_hidden_size;
  const auto [layer, suffix] = split_layer(contract_name, "decoder.layers.");
  if (layer >= m.num_layers) {
    throw InputError(contract_name + " names layer " + std::to_string(layer) + ", the model has " +
                     std::to_string(m.num_layers) + " layers");
  }
  if (layer >= 0) {
    const std::string hf = "model.layers." + std::to_string(layer) + ".";
    if (suffix == "self_attention.linear_qkv.weight") {
      const int64_t q_rows = m.num_heads * D, kv_rows = m.num_kv_heads * D;
      return {{hf + kQkvParts[0], {q_rows, H}, 0},
              {hf + kQkvParts[1], {kv_rows, H}, q_rows * H},
              {hf + kQkvParts[2], {kv_rows, H}, (q_rows + kv_rows) * H}};
    }
    if (suffix == "mlp.linear_fc1.weight")
      return {{hf + kFc1Parts[0], {F, H}, 0}, {hf + kFc1Parts[1], {F, H}, F * H}};
    if (suffix == "mlp.linear_fc2.weight") return {{hf + kLayerFromContract.at(suffix), {H, F}, 0}};
    if (suffix == "self_attention.linear_proj.weight") {
      return {{hf + kLayerFromContract.at(suffix), {H, m.num_heads * D}, 0}};
    }
    if (kLayerFromContract.count(suffix)) return {{hf + kLayerFromContract.at(suffix), {H}, 0}};
  } else if (kModelFromContract.count(contract_name)) {
    const std::string& hf = kModelFromContract.at(contract_name);
    if (contract_name == "decoder.final_layernorm.weight") return {{hf, {H}, 0}};
    if (contract_name == "output_layer.weight" && m.tie_embeddings) return {};  // embed_tokens holds it
    return {{hf, {m.vocab_size, H}, 0}};
  }
  throw InputError(contract_name + " is not a parameter of the Llama model");
}

std::vector<double> hf_layout(const std::string& contract_name, const ModelConfig& m,
                              std::vector<double> values) {
  if (split_layer(contract_name, "decoder.layers.").second != "self_attention.linear_qkv.weight") {
    return values;
  }
  return qkv_separate_from_grouped(m, values, m.hidden_size);
}

std::map<std::string, Recorded> contract_to_hf(const TensorMap& tensors, const ModelConfig& m,
                                               const std::string& group) {
  std::map<std::string, Recorded> out;
  const std::string prefix = group + "/";
  for (const auto& [path, tensor] : tensors) {
    if (path.rfind(prefix, 0) != 0) continue;
    const std::string name = path.substr(prefix.size());
    const std::vector<HfPart> parts = hf_parts_of(name, m);
    if (parts.empty()) continue;
    std::vector<int64_t> shape = parts[0].shape;
    for (size_t i = 1; i < parts.size(); ++i) shape[0] += parts[i].shape[0];  // stacked rows
    if (tensor.shape != shape) {
      throw InputError(path + " has shape " + shape_text(tensor.shape) + ", the model's is " +
                       shape_text(shape));
    }
    const std::vector<double> values = hf_layout(name, m, tensor.values);
    for (const HfPart& part : parts) {
      const auto first = values.begin() + part.offset;
      out[part.name] = Recorded{part.shape, std::vector<double>(first, first + part.numel()), tensor.dtype};
    }
  }
  return out;
}

}  // namespace touchstone::hf
