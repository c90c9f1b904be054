// Hugging Face Llama names and layouts <-> the contract's (the one mapping table for HF checkpoints;
// docs/diffing.md lists it), in both directions, and the conversion between the grouped linear_qkv
// layout and separate [q; k; v] row blocks that HF checkpoints (and many PyTorch models) use.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "oracle/golden/recorded.h"

namespace touchstone::hf {

// Row r of the grouped linear_qkv weight (per KV group g: its query heads, key head g, value head g) is
// row result[r] of the separate layout [all query heads; all key heads; all value heads].
std::vector<int64_t> qkv_separate_row_of_grouped(const ModelConfig& model);

// [q; k; v] rows -> grouped rows, and back; `values` is [(NH + 2 NKV) D, cols] row-major.
std::vector<double> qkv_grouped_from_separate(const ModelConfig& model, const std::vector<double>& values,
                                              int64_t cols);
std::vector<double> qkv_separate_from_grouped(const ModelConfig& model, const std::vector<double>& values,
                                              int64_t cols);

// Converts HF Llama tensors (model.layers.{i}.self_attn.q_proj.weight, ...) into contract tensors at
// `group` (e.g. "steps/1/grads"): q/k/v_proj fused into linear_qkv in the grouped layout, gate/up_proj
// stacked into linear_fc1 [gate; up], the rest renamed. Names already in the contract's form are kept.
// Names it does not know are left out and listed in `ignored`. Throws InputError for a wrong shape or an
// incomplete set (q_proj without k_proj, gate_proj without up_proj).
TensorMap hf_to_contract(const std::map<std::string, Recorded>& tensors, const ModelConfig& model,
                         const std::string& group, std::vector<std::string>& ignored);

// One HF tensor cut from a contract tensor laid out by hf_layout: `numel()` values from element
// `offset` on.
struct HfPart {
  std::string name;            // "model.layers.0.self_attn.k_proj.weight"
  std::vector<int64_t> shape;  // its HF shape
  int64_t offset = 0;          // first element in the contract tensor's hf_layout

  int64_t numel() const;
};

// The HF tensors the contract tensor `contract_name` becomes, in the order they follow each other in
// its hf_layout: linear_qkv -> q_proj, k_proj, v_proj; linear_fc1 -> gate_proj (rows 0 .. F-1), up_proj
// (rows F .. 2F-1); every other tensor one renamed part; none for output_layer.weight of a tied model.
// Throws InputError for a name that is not a parameter of `model`.
std::vector<HfPart> hf_parts_of(const std::string& contract_name, const ModelConfig& model);

// The contract tensor's values in the row order its hf_parts_of cut: linear_qkv's grouped rows as
// [q; k; v] (qkv_separate_from_grouped); every other tensor as it is.
std::vector<double> hf_layout(const std::string& contract_name, const ModelConfig& model,
                              std::vector<double> values);

// The reverse of hf_to_contract: the contract tensors at `group` (keys "group/<name>"; others are
// left out) as HF Llama tensors, keyed by HF name. A tied model gets no lm_head.weight. Throws
// InputError for a tensor that is not a parameter of `model` or has another shape.
std::map<std::string, Recorded> contract_to_hf(const TensorMap& tensors, const ModelConfig& model,
                                               const std::string& group);

}  // namespace touchstone::hf
