// Hugging Face Llama names and layouts -> the contract's (the one mapping table for HF checkpoints;
// docs/diffing.md lists it), and the conversion between the grouped linear_qkv layout and separate
// [q; k; v] row blocks that HF checkpoints (and many PyTorch models) use.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "oracle/golden/recorded.h"

namespace touchstone::diff {

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

}  // namespace touchstone::diff
