// Builds the parameter table in the contract's order: embedding, layers 0..L-1, final norm, output.
#include "model/param_table.h"

#include <algorithm>

namespace touchstone {

int64_t ParamSpec::numel() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

int ParamTable::add(std::string name, std::vector<int64_t> shape, ParamKind kind, int64_t layer,
                    InitRule init) {
  const bool decay = shape.size() >= 2;
  Sharding sharding = Sharding::kReplicated;
  switch (kind) {
    case ParamKind::kEmbedding:
    case ParamKind::kOutput:
    case ParamKind::kQkv:
      sharding = Sharding::kRows;
      break;
    case ParamKind::kFc1:
      sharding = Sharding::kGateUp;
      break;
    case ParamKind::kProj:
    case ParamKind::kFc2:
      sharding = Sharding::kColumns;
      break;
    default:
      break;
  }
  specs_.push_back(ParamSpec{std::move(name), std::move(shape), kind, layer, decay, init, sharding});
  return size() - 1;
}

ParamTable::ParamTable(const ModelConfig& m) {
  const int64_t H = m.hidden_size, V = m.vocab_size, F = m.ffn_hidden_size;
  embedding_ = add("embedding.word_embeddings.weight", {V, H}, ParamKind::kEmbedding, -1, InitRule::kNormal);
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string prefix = "decoder.layers." + std::to_string(l) + ".";
    LayerParamIds ids{};
    ids.input_norm = add(prefix + "input_layernorm.weight", {H}, ParamKind::kInputNorm, l, InitRule::kOnes);
    ids.qkv = add(prefix + "self_attention.linear_qkv.weight", {m.qkv_rows(), H}, ParamKind::kQkv, l,
                  InitRule::kNormal);
    ids.proj = add(prefix + "self_attention.linear_proj.weight", {H, m.num_heads * m.head_dim()},
                   ParamKind::kProj, l, InitRule::kScaledNormal);
    ids.pre_mlp_norm =
        add(prefix + "pre_mlp_layernorm.weight", {H}, ParamKind::kPreMlpNorm, l, InitRule::kOnes);
    ids.fc1 = add(prefix + "mlp.linear_fc1.weight", {2 * F, H}, ParamKind::kFc1, l, InitRule::kNormal);
    ids.fc2 = add(prefix + "mlp.linear_fc2.weight", {H, F}, ParamKind::kFc2, l, InitRule::kScaledNormal);
    layers_.push_back(ids);
  }
  final_norm_ = add("decoder.final_layernorm.weight", {H}, ParamKind::kFinalNorm, -1, InitRule::kOnes);
  output_ = m.tie_embeddings ? embedding_
                             : add("output_layer.weight", {V, H}, ParamKind::kOutput, -1, InitRule::kNormal);
}

int ParamTable::find(const std::string& name) const {
  auto it = std::find_if(specs_.begin(), specs_.end(), [&](const ParamSpec& s) { return s.name == name; });
  return it == specs_.end() ? -1 : static_cast<int>(it - specs_.begin());
}

ParamTensors ParamTensors::zeros_like(const ParamTable& table) {
  ParamTensors result;
  for (const ParamSpec& spec : table.specs())
    result.tensors.emplace_back(static_cast<size_t>(spec.numel()), 0.0);
  return result;
}

void ParamTensors::fill(double value) {
  for (auto& tensor : tensors) std::fill(tensor.begin(), tensor.end(), value);
}

}  // namespace touchstone
