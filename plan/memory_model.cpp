// Recipes, parameter counts and the published activation formulas (see memory_model.h).
#include "plan/memory_model.h"

#include <algorithm>
#include <limits>

#include "common/errors.h"
#include "plan/checked.h"
#include "plan/format.h"

namespace touchstone::plan {

const std::vector<Recipe>& recipes() {
  // Megatron-Core's table (docs/user-guide/features/dist_optimizer.md) gives the totals 18, 20, 16 and
  // 6 + 12/d, 4 + 16/d, 8 + 8/d; the split into kinds below reproduces them. fp64 is Touchstone's own.
  static const std::vector<Recipe> kRecipes = {
      {"bf16", "bf16 weights 2 + fp32 grads 4; fp32 master weights 4 + Adam m 4 + v 4", 2, 4, 4, 0, 8},
      {"fp16", "fp16 weights 2 + fp16 grads 2; fp32 master weights 4 + fp32 master grads 4 + Adam m 4 + v 4",
       2, 2, 4, 4, 8},
      {"fp32", "fp32 weights 4 + fp32 grads 4 (the weights are the master copy); Adam m 4 + v 4", 4, 4, 0, 0,
       8},
      {"fp64", "fp64 weights 8 + fp64 grads 8 (the weights are the master copy); Adam m 8 + v 8", 8, 8, 0, 0,
       16},
  };
  return kRecipes;
}

const Recipe& find_recipe(const std::string& name) {
  std::string known;
  for (const Recipe& recipe : recipes()) {
    if (recipe.name == name) return recipe;
    known += (known.empty() ? "" : ", ") + recipe.name;
  }
  throw InputError("unknown recipe \"" + name + "\" (known: " + known + ")");
}

std::string bytes_per_param_formula(const Recipe& recipe, bool distributed_optimizer) {
  if (!distributed_optimizer) return fixed(recipe.replicated() + recipe.shardable(), 0);
  return fixed(recipe.replicated(), 0) + " + " + fixed(recipe.shardable(), 0) + "/DP";
}

ModelState model_state(double params, const Recipe& recipe, int64_t zero_stage, int64_t dp) {
  const double shard = zero_stage >= 1 ? 1.0 / static_cast<double>(dp) : 1.0;
  ModelState state;
  state.params = params;
  state.weights = params * recipe.weights * (zero_stage >= 3 ? shard : 1.0);
  state.grads = params * recipe.grads * (zero_stage >= 2 ? shard : 1.0);
  state.master_weights = params * recipe.master_weights * shard;
  state.master_grads = params * recipe.master_grads * shard;
  state.moments = params * recipe.moments * shard;
  return state;
}

double layer_params_per_rank(const ModelShape& m, int64_t tp) {
  const auto h = static_cast<double>(m.hidden), d = static_cast<double>(m.head_dim());
  const auto a = static_cast<double>(m.heads), k = static_cast<double>(m.kv_heads);
  const auto f = static_cast<double>(m.ffn), t = static_cast<double>(tp);
  const double qkv = (a + 2 * k) * d * h, proj = h * a * d, fc1 = 2 * f * h, fc2 = h * f, norms = 2 * h;
  return (qkv + proj + fc1 + fc2) / t + norms;
}

double embedding_params_per_rank(const ModelShape& m, int64_t tp, int64_t vocab) {
  return static_cast<double>(vocab) / static_cast<double>(tp) * static_cast<double>(m.hidden);
}

double head_params_per_rank(const ModelShape& m, int64_t tp, int64_t vocab, bool holds_embedding) {
  // Final norm, plus the output layer unless it is the embedding this rank already holds (tied
  // embeddings on a single stage); with tied embeddings over several stages the last stage keeps its
  // own copy, as Megatron-LM does.
  const auto final_norm = static_cast<double>(m.hidden);
  const bool own_output = !(m.tied_embeddings && holds_embedding);
  return final_norm + (own_output ? embedding_params_per_rank(m, tp, vocab) : 0.0);
}

double total_params(const ModelShape& m) {
  const double embedding = embedding_params_per_rank(m, 1, m.vocab);
  return embedding + static_cast<double>(m.layers) * layer_params_per_rank(m, 1) +
         head_params_per_rank(m, 1, m.vocab, true);
}

int64_t padded_vocab(int64_t vocab, int64_t multiple, int64_t tp) {
  const int64_t unit =
      checked_product({multiple, tp}, std::numeric_limits<int64_t>::max(), "the vocabulary multiple x tp");
  const int64_t units = checked_add(vocab, unit - 1, "the padded vocabulary") / unit;
  return checked_product({units, unit}, std::numeric_limits<int64_t>::max(), "the padded vocabulary");
}

std::string to_string(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

namespace {
double sbh(const ModelShape& m, int64_t micro_batch) {
  return static_cast<double>(m.seq) * static_cast<double>(micro_batch) * static_cast<double>(m.hidden);
}
}  // namespace

double megatron_layer_activation_bytes(const ModelShape& m, int64_t micro_batch, int64_t tp,
                                       bool sequence_parallel, Recompute recompute, bool flash_attention) {
  const double t = static_cast<double>(tp), base = sbh(m, micro_batch);
  // The attention-score term 5as/h: softmax output (2 bytes), dropout mask (1) and dropout output (2)
  // for each of the a x s x s scores, per unit of sbh.
  const double scores = flash_attention ? 0.0
                                        : 5.0 * static_cast<double>(m.heads) * static_cast<double>(m.seq) /
                                              static_cast<double>(m.hidden);
  switch (recompute) {
    case Recompute::kFull:
      return sequence_parallel ? 2.0 * base / t : 2.0 * base;
    case Recompute::kSelective:
      return sequence_parallel ? 34.0 * base / t : base * (10.0 + 24.0 / t);
    case Recompute::kNone:
      break;
  }
  return sequence_parallel ? base / t * (34.0 + scores) : base * (10.0 + 24.0 / t + scores / t);
}

double megatron_embedding_activation_bytes(const ModelShape& m, int64_t micro_batch, int64_t tp,
                                           bool sequence_parallel) {
  return sequence_parallel ? sbh(m, micro_batch) / static_cast<double>(tp) : sbh(m, micro_batch);
}

double megatron_head_activation_bytes(const ModelShape& m, int64_t micro_batch, int64_t tp,
                                      bool sequence_parallel, int64_t vocab) {
  const double t = static_cast<double>(tp), base = sbh(m, micro_batch);
  const double norm_and_projection = sequence_parallel ? 4.0 * base / t : 4.0 * base;
  const double fp32_logits =
      4.0 * static_cast<double>(m.seq) * static_cast<double>(micro_batch) * static_cast<double>(vocab) / t;
  return norm_and_projection + fp32_logits;
}

double megatron_recompute_working_bytes(const ModelShape& m, int64_t micro_batch, int64_t tp,
                                        bool sequence_parallel, Recompute recompute, bool flash_attention) {
  switch (recompute) {
    case Recompute::kFull:
      return megatron_layer_activation_bytes(m, micro_batch, tp, sequence_parallel, Recompute::kNone,
                                             flash_attention);
    case Recompute::kSelective:
      if (flash_attention) return 0.0;  // nothing left to recompute: the scores are never stored
      return 5.0 * static_cast<double>(m.heads) * static_cast<double>(m.seq) * static_cast<double>(m.seq) *
             static_cast<double>(micro_batch) / static_cast<double>(tp);
    case Recompute::kNone:
      break;
  }
  return 0.0;
}

int64_t in_flight_micro_batches(int64_t stage, int64_t pp, int64_t micro_batches) {
  const int64_t warm = pp - stage;
  return micro_batches > 0 ? std::min(warm, micro_batches) : warm;
}

}  // namespace touchstone::plan
