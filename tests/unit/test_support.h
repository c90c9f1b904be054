// Small models and batches shared by the unit tests.
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include "common/config.h"
#include "data/packing.h"
#include "model/param_table.h"
#include "model/transformer.h"
#include "oracle/global_batch.h"
#include "parallel/comm/single_rank_group.h"
#include "parallel/tensor/regions.h"

namespace touchstone::testing {

// A model small enough to finite-difference every parameter: V=16, H=8, 2 layers, GQA 2:1, F=12.
inline Config tiny_config() {
  Config c;
  c.model.vocab_size = 16;
  c.model.hidden_size = 8;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.model.num_kv_heads = 1;
  c.model.ffn_hidden_size = 12;
  c.model.seq_length = 8;
  c.model.init_std = 0.3;  // large enough that every block is visibly non-linear
  c.data.eos_token = 1;
  c.data.pad_token = 0;
  c.train.global_batch_size = 4;
  c.train.micro_batch_size = 2;
  return c;
}

// The small model of the step, resume and diff-signature tests: V=64, H=16, 2 layers, 4 query / 2 KV
// heads, F=24, T=16 (the built-in data at T=16 packs into 24 windows).
inline Config small_model_config() {
  Config c;
  c.model.vocab_size = 64;
  c.model.hidden_size = 16;
  c.model.num_layers = 2;
  c.model.num_heads = 4;
  c.model.num_kv_heads = 2;
  c.model.ffn_hidden_size = 24;
  c.model.seq_length = 16;
  c.model.init_std = 0.2;  // visibly non-linear
  return c;
}

// The whole model on this process: tp = 1, one pipeline stage. The region lives as long as the test.
inline Transformer whole_model(const Config& c, const ParamTable& table, Backend& backend) {
  static SingleRankGroup group{"tp"};
  static std::vector<std::unique_ptr<TensorParallelRegion>> regions;
  regions.push_back(std::make_unique<TensorParallelRegion>(group, false, backend));
  return Transformer(c.model, c.data.document_masking, c.train.seed, table, backend, *regions.back(),
                     StageRange{0, c.model.num_layers, true, true});
}

// Packs `documents` with the config's data rules and returns the first global batch of B windows.
inline GlobalBatch batch_from_documents(const Config& c, const std::vector<data::Document>& documents) {
  const data::PackingOptions options{
      static_cast<int>(c.model.seq_length), static_cast<int32_t>(c.data.eos_token),
      static_cast<int32_t>(c.data.pad_token), c.data.eos_loss, c.data.document_masking};
  return make_global_batch(data::pack_documents(documents, options), c.train.global_batch_size, 1);
}

// ||a - b|| / ||b|| over all tensors together (||a - b|| when b is zero).
inline double relative_l2(const ParamTensors& a, const ParamTensors& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    for (size_t i = 0; i < a.tensors[t].size(); ++i) {
      diff += (a.tensors[t][i] - b.tensors[t][i]) * (a.tensors[t][i] - b.tensors[t][i]);
      ref += b.tensors[t][i] * b.tensors[t][i];
    }
  }
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

inline double relative_l2(const std::vector<double>& a, const std::vector<double>& b) {
  return relative_l2(ParamTensors{{a}}, ParamTensors{{b}});
}

}  // namespace touchstone::testing
