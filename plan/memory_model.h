// The memory arithmetic of one GPU: bytes per parameter of each precision recipe, parameter counts of
// a pipeline stage's tensor-parallel shard, and activation bytes per layer and micro-batch from
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"). Every
// per-stage and per-rank number of `touchstone plan memory` is built from these functions. See
// docs/planning.md for the formulas and their sources.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace touchstone::plan {

// Bytes per parameter of each kind of model state. With the distributed optimizer the master weights,
// master gradients and optimizer moments are sharded over the data-parallel group; weights and the
// gradients the backward pass writes are not.
struct Recipe {
  std::string name;
  std::string description;
  double weights = 0, grads = 0;                             // held whole on every data-parallel rank
  double master_weights = 0, master_grads = 0, moments = 0;  // sharded by the distributed optimizer
  double replicated() const { return weights + grads; }
  double shardable() const { return master_weights + master_grads + moments; }
};

const std::vector<Recipe>& recipes();
// Throws InputError listing the known names.
const Recipe& find_recipe(const std::string& name);

// "18" without the distributed optimizer, "6 + 12/DP" with it.
std::string bytes_per_param_formula(const Recipe& recipe, bool distributed_optimizer);

// Bytes of each kind of model state for `params` parameters on one GPU.
struct ModelState {
  double params = 0;
  double weights = 0, grads = 0, master_weights = 0, master_grads = 0, moments = 0;
  double total() const { return weights + grads + master_weights + master_grads + moments; }
  double bytes_per_param() const { return params > 0 ? total() / params : 0.0; }
};
// ZeRO stage 1 (the distributed optimizer) divides master weights, master gradients and moments by dp;
// stage 2 also the gradients, stage 3 also the weights.
ModelState model_state(double params, const Recipe& recipe, int64_t zero_stage, int64_t dp);

// A Llama-style decoder (common/config.h): GQA attention, SwiGLU MLP, RMSNorm, untied or tied output.
struct ModelShape {
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 0;
  bool tied_embeddings = false;
  int64_t head_dim() const { return heads > 0 ? hidden / heads : 0; }
  bool known() const { return layers > 0 && hidden > 0 && heads > 0; }
};

// Parameters one tensor-parallel rank holds. Matrices split over tp (qkv by whole KV groups, proj and
// fc2 by columns, fc1 by [gate; up] rows, vocabulary by rows); norm weights are replicated.
double layer_params_per_rank(const ModelShape& m, int64_t tp);
double embedding_params_per_rank(const ModelShape& m, int64_t tp, int64_t padded_vocab);
double head_params_per_rank(const ModelShape& m, int64_t tp, int64_t padded_vocab, bool holds_embedding);
// The whole model once (tied embeddings counted once).
double total_params(const ModelShape& m);
// The vocabulary rounded up to a multiple of `multiple` x tp (Megatron pads to 128 x tp).
int64_t padded_vocab(int64_t vocab, int64_t multiple, int64_t tp);

enum class Recompute { kNone, kSelective, kFull };
std::string to_string(Recompute recompute);

// Korthikanti et al. 2022, 16-bit activations (section 4, Table 2), bytes for one layer and one
// micro-batch of b sequences of s tokens on one tensor-parallel rank:
//   no recomputation:         sbh(10 + 24/t + 5as/(ht))   [t = 1: sbh(34 + 5as/h)]
//   + sequence parallelism:   sbh/t (34 + 5as/h)
//   selective recomputation:  sbh(10 + 24/t), with sequence parallelism 34 sbh/t
//   full recomputation:       2 sbh (the layer input only), with sequence parallelism 2 sbh/t
// With flash attention the a x s x s scores are never stored: the 5as/h term is dropped (the softmax
// statistics it keeps instead, 4 bytes x a x s x b / t, are below 0.2% of 34 sbh/t and left out).
double megatron_layer_activation_bytes(const ModelShape& m, int64_t micro_batch, int64_t tp,
                                       bool sequence_parallel, Recompute recompute, bool flash_attention);
// Section 4.3: the first stage keeps the embedding dropout mask for each in-flight micro-batch (sbh/t
// bytes with sequence parallelism, sbh without).
double megatron_embedding_activation_bytes(const ModelShape& m, int64_t micro_batch, int64_t tp,
                                           bool sequence_parallel);
// Section 4.3: the last stage keeps the final norm input, the output layer input and fp32 logits for
// cross entropy: 4sbh/t (1 + v/h) with sequence parallelism; the two hidden-size terms are not split
// over t without it.
double megatron_head_activation_bytes(const ModelShape& m, int64_t micro_batch, int64_t tp,
                                      bool sequence_parallel, int64_t padded_vocab);
// What recomputation itself needs while one layer's backward runs: the full activations of that layer
// (full recomputation) or its attention scores (selective, without flash attention); 0 without
// recomputation.
double megatron_recompute_working_bytes(const ModelShape& m, int64_t micro_batch, int64_t tp,
                                        bool sequence_parallel, Recompute recompute, bool flash_attention);

// Micro-batches whose activations stage `stage` (0-based) of `pp` holds at once under 1F1B with `m`
// micro-batches per replica: min(pp - stage, m). m = 0 means unknown (taken as large).
int64_t in_flight_micro_batches(int64_t stage, int64_t pp, int64_t micro_batches);

}  // namespace touchstone::plan
