// HF Llama -> contract names and layouts.
#include "oracle/diff/hf_names.h"

#include <algorithm>
#include <cctype>

#include "common/errors.h"

namespace touchstone::diff {

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

// "model.layers.12.mlp.up_proj.weight" -> {12, "mlp.up_proj.weight"}; layer -1 when not a layer name.
std::pair<int64_t, std::string> split_layer(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return {-1, name};
  size_t i = prefix.size(), j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  if (j == i || j >= name.size() || name[j] != '.' || j - i > 9) return {-1, name};
  return {std::stoll(name.substr(i, j - i)), name.substr(j + 1)};
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

}  // namespace touchstone::diff
