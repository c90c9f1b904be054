// The one table of parameters: every tensor of the model described once (docs/contract.md, "Model").
//
// Name, full shape, which layer it belongs to, whether weight decay applies and how it is initialised
// all live here; init, the optimizer, the gradient norm, golden files and --init-from read this table
// instead of knowing the model's structure themselves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "parallel/tensor/sharding.h"  // Sharding: each parameter's tensor-parallel layout

namespace touchstone {

enum class ParamKind { kEmbedding, kInputNorm, kQkv, kProj, kPreMlpNorm, kFc1, kFc2, kFinalNorm, kOutput };

enum class InitRule {
  kOnes,          // norm weights
  kNormal,        // normal(0, init_std)
  kScaledNormal,  // normal(0, init_std / sqrt(2 * num_layers)): outputs added to the residual stream
};

struct ParamSpec {
  std::string name;            // canonical name, e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  std::vector<int64_t> shape;  // full (unsharded) shape
  ParamKind kind;
  int64_t layer;      // global layer number, -1 outside the decoder layers
  bool weight_decay;  // AdamW decay applies to tensors of 2 or more dimensions only
  InitRule init;
  Sharding sharding;

  int64_t numel() const;
};

// Indices into the table for the tensors of one decoder layer.
struct LayerParamIds {
  int input_norm, qkv, proj, pre_mlp_norm, fc1, fc2;
};

class ParamTable {
 public:
  explicit ParamTable(const ModelConfig& model);

  const std::vector<ParamSpec>& specs() const { return specs_; }
  int size() const { return static_cast<int>(specs_.size()); }
  const ParamSpec& operator[](int id) const { return specs_[static_cast<size_t>(id)]; }
  int find(const std::string& name) const;  // -1 when absent

  int embedding() const { return embedding_; }
  int final_norm() const { return final_norm_; }
  int output() const { return output_; }  // == embedding() when embeddings are tied
  const LayerParamIds& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }

 private:
  int add(std::string name, std::vector<int64_t> shape, ParamKind kind, int64_t layer, InitRule init);

  std::vector<ParamSpec> specs_;
  std::vector<LayerParamIds> layers_;
  int embedding_ = -1, final_norm_ = -1, output_ = -1;
};

// One tensor per table entry (values, gradients, optimizer moments), full shapes, row-major.
struct ParamTensors {
  std::vector<std::vector<double>> tensors;

  static ParamTensors zeros_like(const ParamTable& table);
  std::vector<double>& operator[](int id) { return tensors[static_cast<size_t>(id)]; }
  const std::vector<double>& operator[](int id) const { return tensors[static_cast<size_t>(id)]; }
  void fill(double value);
};

}  // namespace touchstone
