// The alternative rules, evaluated on the golden batch from the parameters the step started from.
#include "oracle/diff/hypotheses.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "kernels/backend.h"
#include "model/params.h"
#include "model/transformer.h"
#include "oracle/diff/added_mask.h"
#include "oracle/diff/context_parallel_mistakes.h"
#include "oracle/diff/rope_mistakes.h"
#include "oracle/hf/hf_names.h"
#include "oracle/train_step.h"
#include "parallel/comm/single_rank_group.h"
#include "parallel/tensor/regions.h"

namespace touchstone::diff {

namespace {

struct Rule {
  std::string signature, message;
  bool document_masking;
  LossNormalization normalization;
  bool positions_from_zero = false;  // position ids 0..T-1 in every window instead of the recorded ones
  bool qkv_read_separate = false;    // linear_qkv rows read as [q heads; k heads; v heads]
  // With qkv_read_separate: the candidate reports the gradient regrouped per KV group again (the wrong
  // split happened only when converting to separate q/k/v projections, and the diff converted back).
  bool qkv_gradient_regrouped = false;
  bool mask_added = false;  // a 0/1 mask added to the attention scores (added_mask.h)
  // Position i trained on targets[i + 1], the last position of every window on nothing (Hugging Face's
  // labels= shifting the already shifted golden targets once more).
  bool targets_shifted = false;
  bool golden_counts = false;  // with targets_shifted: normalised by the golden batch's loss-token counts
  // The linear layers' and the embedding's weight gradients without the last micro-batch's share (the
  // norm weights' complete): the optimizer stepped before a split backward's last W had run.
  bool last_weight_gradients_missing = false;
  // ZeRO-3 without the gather before each layer's backward: the input gradients through the linear layers
  // of decoder layers 0..L-2 computed with layer L-1's weights (the buffer the forward's last gather left).
  bool stale_backward_weights = false;
  // A context-parallel mistake played on one rank (context_parallel_mistakes.h), at context_parallel ranks.
  std::optional<ContextParallelMistake> context_parallel_mistake = std::nullopt;
  int context_parallel = 0;
  std::optional<RopeMistake> rope_mistake = std::nullopt;  // RoPE computed another way (rope_mistakes.h)
  // Matched within kFloat32RopeSlack when the tolerance is tighter: the frameworks that make these RoPE
  // mistakes (torchtitan) also compute RoPE in float32, which adds about 2e-9 to a mistake of 1e-2.
  bool float32_rope_slack = false;
};

// 500 x torchtitan's float32 RoPE in an FP64 run (2.3e-9 relative L2 on the gradients), and 1e-4 of the
// RoPE mistakes themselves (1e-2): the mistake is named whether or not float32 RoPE rides along, and no
// other rule comes within it.
constexpr double kFloat32RopeSlack = 1e-6;

// The model's parameter hooks (model/transformer.h) playing that ZeRO-3 mistake: before the backward of
// layer l < L-1 its linear weights are replaced by layer L-1's, and put back after it. The weight
// gradients (dy^T x) read no weight, so only the input gradients change.
class StaleBackwardWeights final : public ParameterHooks {
 public:
  StaleBackwardWeights(const ParamTable& table, int64_t num_layers, ParamTensors& params)
      : table_(table), last_(num_layers - 1), params_(params) {}
  void before_forward(const ParameterUnit&) override {}
  void after_forward(const ParameterUnit&) override {}
  void before_backward(const ParameterUnit& unit) override {
    if (unit.kind != ParameterUnit::Kind::kLayer || unit.layer >= last_) return;
    const std::vector<int> mine = linears(unit.layer), stale = linears(last_);
    for (size_t i = 0; i < mine.size(); ++i) {
      saved_.push_back(params_[mine[i]]);
      params_[mine[i]] = params_[stale[i]];
    }
  }
  void after_backward(const ParameterUnit& unit, bool) override {
    if (unit.kind != ParameterUnit::Kind::kLayer || unit.layer >= last_) return;
    const std::vector<int> mine = linears(unit.layer);
    for (size_t i = 0; i < mine.size(); ++i) params_[mine[i]] = std::move(saved_[i]);
    saved_.clear();
  }
  void after_weight_gradients(const ParameterUnit&) override {}

 private:
  std::vector<int> linears(int64_t layer) const {
    const LayerParamIds& l = table_.layer(layer);
    return {l.qkv, l.proj, l.fc1, l.fc2};
  }
  const ParamTable& table_;
  int64_t last_;
  ParamTensors& params_;
  std::vector<std::vector<double>> saved_;
};

std::vector<Rule> rules_for(const Config& config) {
  const bool masking = config.data.document_masking;
  const LossNormalization golden_norm = config.train.loss_normalization;
  const bool global = golden_norm == LossNormalization::kGlobalTokenMean;
  const LossNormalization other_norm =
      global ? LossNormalization::kPerMicrobatchMean : LossNormalization::kGlobalTokenMean;
  std::vector<Rule> rules;
  rules.push_back({"loss_normalization",
                   "wrong loss normalisation: the candidate matches " + option_name(other_norm) +
                       (global ? " (the mean of the micro-batch means, micro_batch_size " +
                                     std::to_string(config.train.micro_batch_size) + ")"
                               : " (all token losses / all loss tokens)") +
                       " on the golden batch; the golden run uses " + option_name(golden_norm),
                   masking, other_norm});
  if (masking) {
    rules.push_back({"document_mask_missing",
                     "document mask missing: the candidate matches plain causal attention across documents "
                     "(position ids as recorded, reset per document)",
                     false, golden_norm});
    rules.push_back(
        {"document_mask_missing_positions_not_reset",
         "document mask missing and position ids not reset: the candidate matches causal attention "
         "across documents with positions 0..T-1 in every window (a Megatron-LM run over SBHD does this "
         "whatever its reset-attention-mask and reset-position-ids flags say: pack the documents, "
         "docs/frameworks/megatron.md)",
         false, golden_norm, true});
  } else {
    rules.push_back(
        {"document_mask_applied",
         "document mask applied: the candidate matches per-document attention, the golden run has "
         "data.document_masking = false",
         true, golden_norm});
  }
  rules.push_back(
      {"qkv_grouping",
       "QKV rows in the wrong grouping: the candidate matches a model that reads linear_qkv as "
       "[all query heads; all key heads; all value heads] instead of per KV group [its query heads; "
       "key; value]",
       masking, golden_norm, false, true});
  rules.push_back(
      {"qkv_conversion",
       "linear_qkv split as [all query heads; all key heads; all value heads] when converting to separate "
       "q/k/v projections (e.g. Hugging Face's q_proj, k_proj, v_proj): the candidate matches a model loaded "
       "that way, its gradients converted back per KV group; split each KV group into [its query heads; "
       "key; value] instead",
       masking, golden_norm, false, true, true});
  Rule mask_added{"attention_mask_added",
                  "attention mask given as 0/1 or boolean and added to the scores: the candidate matches "
                  "attention in which every query sees every key of its window (future ones too) and the "
                  "allowed keys score +1; pass an additive mask: 0 where allowed, the dtype's minimum "
                  "elsewhere (touchstone.masks.hf_attention_mask)",
                  masking, golden_norm};
  mask_added.mask_added = true;
  rules.push_back(mask_added);
  // Normalised by the shifted targets' own loss-token counts (labels= alone: Hugging Face's mean over
  // its shifted tokens), or by the golden counts (num_items_in_batch, or the summed loss times the golden
  // loss weight).
  for (const bool golden_counts : {false, true}) {
    Rule shifted{"targets_shifted_twice",
                 "targets shifted twice: the candidate matches training position i on targets[i+1] (the last "
                 "position of each window untrained): the golden targets are already shifted; compute the "
                 "loss from the logits (touchstone.loss.micro_batch_loss) instead of passing labels=",
                 masking, golden_norm};
    shifted.targets_shifted = true;
    shifted.golden_counts = golden_counts;
    rules.push_back(shifted);
  }
  const std::pair<RopeMistake, Rule> rope_rules[] = {
      {RopeMistake::kAdjacentPairs,
       {"rope_adjacent_pairs",
        "RoPE over adjacent pairs: the candidate matches a model that rotates each head's pairs "
        "(2i, 2i+1) (Meta's original Llama code, torchtitan's complex RoPE) on weights laid out for the "
        "pairs (i, i + D/2) that the golden model rotates (Megatron-Core, Hugging Face); permute each "
        "head's q and k rows when loading (row 2i from row i, row 2i+1 from row i + D/2; "
        "touchstone.torchtitan does) and the gradients back",
        masking, golden_norm}},
      {RopeMistake::kCosineOnly,
       {"rope_cosine_only",
        "RoPE without its sine: the candidate matches a model that scales each pair by cos(angle) instead of "
        "rotating it, which is what a complex cos + i sin table cast to a real dtype leaves (torchtitan's "
        "model.to(torch.float64) drops freqs_cis's imaginary part with only a UserWarning); convert with "
        "model.double(), or rebuild the table in float64",
        masking, golden_norm}}};
  for (auto [mistake, rule] : rope_rules) {
    rule.rope_mistake = mistake;
    rule.float32_rope_slack = true;
    rules.push_back(rule);
  }
  Rule before_last_w{
      "weight_gradients_before_last_w",
      "optimizer step before the last weight-gradient pass: the candidate's linear-layer and "
      "embedding weight gradients lack the last micro-batch's share, its norm weights have it "
      "(a split backward's deferred W, zero-bubble schedules); step only after every W has run",
      masking, golden_norm};
  before_last_w.last_weight_gradients_missing = true;
  rules.push_back(before_last_w);
  if (config.model.num_layers > 1) {
    Rule not_regathered{
        "parameters_not_regathered_for_backward",
        "parameters not gathered again before the backward (ZeRO-3 / FSDP): the candidate's input gradients "
        "through the linear layers of decoder layers 0.." +
            std::to_string(config.model.num_layers - 2) + " use layer " +
            std::to_string(config.model.num_layers - 1) +
            "'s weights, the unsharded buffer the forward's last gather left; all-gather each layer's "
            "parameters before its backward (FSDP2's pre-backward hook)",
        masking, golden_norm};
    not_regathered.stale_backward_weights = true;
    rules.push_back(not_regathered);
  }
  // Context parallelism at cp = 2, 4, 8 wherever the window splits into 2cp chunks.
  for (int cp = 2; cp <= 8 && config.model.seq_length % (2 * cp) == 0; cp *= 2) {
    const std::string ranks = "cp = " + std::to_string(cp) + " ranks";
    Rule merge{
        "cp_attention_merge_without_lse",
        "ring attention merged without the log-sum-exp weights: the candidate matches " + ranks +
            " adding the attention outputs of each rank's K/V block as they are, each normalised over "
            "its own keys; weight each block's output by exp(lse_block - lse) (flash attention's merge, "
            "Megatron-LM's ring attention)",
        masking, golden_norm};
    merge.context_parallel_mistake = ContextParallelMistake::kMergeWithoutLse;
    merge.context_parallel = cp;
    rules.push_back(merge);
    Rule unbalanced{
        "cp_chunks_not_load_balanced",
        "context-parallel chunks assigned without load balancing while the positions assume it: the "
        "candidate matches " +
            ranks +
            " holding contiguous slices of each window (tokens, targets, document ids) with the "
            "positions of the load-balanced split (rank r: chunks r and " +
            std::to_string(2 * cp - 1) + "-r of the window cut in " + std::to_string(2 * cp) +
            ") for RoPE and the causal mask; split tokens, targets and ids with the same load-balanced "
            "assignment as the positions",
        masking, golden_norm};
    unbalanced.context_parallel_mistake = ContextParallelMistake::kChunksNotLoadBalanced;
    unbalanced.context_parallel = cp;
    rules.push_back(unbalanced);
  }
  return rules;
}

// The golden step's loss and gradients under `rule`, with the gradients in the layout the candidate
// stores (for the QKV rule: the rows as the candidate's model reads them).
ObjectiveResult evaluate_rule(const Rule& rule, const Config& config, const ParamTable& table,
                              const ParamTensors& params, const GlobalBatch& batch, Backend& backend,
                              const TensorParallelRegion& region) {
  GlobalBatch b = batch;
  for (int64_t w = 0; rule.targets_shifted && w < b.windows; ++w) {
    for (int64_t i = 0; i < b.seq; ++i) {
      const auto at = static_cast<size_t>(w * b.seq + i);
      b.targets[at] = i + 1 < b.seq ? batch.targets[at + 1] : -100;
    }
  }
  if (rule.positions_from_zero) {
    for (size_t i = 0; i < b.position_ids.size(); ++i) {
      b.position_ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) % b.seq);
    }
  }
  if (rule.context_parallel_mistake == ContextParallelMistake::kChunksNotLoadBalanced) {
    // The RoPE position ids of slot i are those of the load-balanced slot p(i).
    const std::vector<int32_t> slot = load_balanced_slot_positions(b.seq, rule.context_parallel);
    for (int64_t w = 0; w < b.windows; ++w) {
      for (int64_t i = 0; i < b.seq; ++i) {
        b.position_ids[static_cast<size_t>(w * b.seq + i)] =
            batch.position_ids[static_cast<size_t>(w * b.seq + slot[static_cast<size_t>(i)])];
      }
    }
  }
  ParamTensors p = params;
  const int64_t H = config.model.hidden_size;
  for (int64_t l = 0; rule.qkv_read_separate && l < config.model.num_layers; ++l) {
    p[table.layer(l).qkv] = hf::qkv_grouped_from_separate(config.model, p[table.layer(l).qkv], H);
  }
  Transformer model(config.model, rule.document_masking, config.train.seed, table, backend, region,
                    StageRange{0, config.model.num_layers, true, true});
  StaleBackwardWeights stale(table, config.model.num_layers, p);
  if (rule.stale_backward_weights) model.set_parameter_hooks(&stale);
  ObjectiveResult r = evaluate_objective(model, table, p, b, config.train.micro_batch_size,
                                         rule.normalization, true, rule.golden_counts ? &batch : nullptr);
  for (int64_t l = 0; rule.qkv_read_separate && !rule.qkv_gradient_regrouped && l < config.model.num_layers;
       ++l) {
    r.grads[table.layer(l).qkv] = hf::qkv_separate_from_grouped(config.model, r.grads[table.layer(l).qkv], H);
  }
  if (rule.last_weight_gradients_missing) {
    // The last micro-batch's share alone: every other window's targets ignored, the loss weights those
    // of the whole batch (counts_from), so that the shares add up to r. The subtraction rounds at
    // the level of r's own rounding, far inside any tolerance.
    GlobalBatch last = b;
    const int64_t first_window = b.windows - config.train.micro_batch_size;
    std::fill(last.targets.begin(), last.targets.begin() + first_window * b.seq, -100);
    const ObjectiveResult share = evaluate_objective(model, table, p, last, config.train.micro_batch_size,
                                                     rule.normalization, true, &b);
    for (int id = 0; id < table.size(); ++id) {
      const ParamKind kind = table[id].kind;
      if (kind == ParamKind::kInputNorm || kind == ParamKind::kPreMlpNorm || kind == ParamKind::kFinalNorm) {
        continue;  // computed with the input gradients, in the first half
      }
      std::vector<double>& g = r.grads[id];
      for (size_t i = 0; i < g.size(); ++i) g[i] -= share.grads[id][i];
    }
  }
  return r;
}

}  // namespace

std::vector<Verdict> match_recomputed_rules(
    const GoldenReader& golden, const ParamTensors& params, const TensorMap& candidate, int64_t step,
    const std::function<std::optional<Tolerance>(const std::string&)>& tolerance_of,
    const std::function<bool(const ParamTensors&)>& update_matches) {
  const std::string prefix = "steps/" + std::to_string(step) + "/";
  const ParamTable& table = golden.table();
  std::vector<int> compared;  // the candidate's gradients of the step (-1: its loss)
  if (candidate.count(prefix + "loss")) compared.push_back(-1);
  for (int id = 0; id < table.size(); ++id) {
    if (candidate.count(prefix + "grads/" + table[id].name)) compared.push_back(id);
  }
  if (step < 1 || (compared.empty() && !update_matches)) return {};

  const GlobalBatch batch = golden.batch(step);
  std::unique_ptr<Backend> backend = make_cpu_backend();
  AddedMaskBackend added_mask;
  SingleRankGroup group("tp");
  const TensorParallelRegion region(group, false, *backend), added_mask_region(group, false, added_mask);
  std::vector<Verdict> verdicts;
  for (const Rule& rule : rules_for(golden.config())) {
    const bool named = std::any_of(verdicts.begin(), verdicts.end(),
                                   [&](const Verdict& v) { return v.signature == rule.signature; });
    if (named) continue;  // another variant of the rule matched already
    auto evaluate = [&](Backend& with, const TensorParallelRegion& in) {
      return evaluate_rule(rule, golden.config(), table, params, batch, with, in);
    };
    auto mistaken = [&] {
      ContextParallelMistakeBackend cp_backend(*rule.context_parallel_mistake, rule.context_parallel);
      return evaluate(cp_backend, TensorParallelRegion(group, false, cp_backend));
    };
    auto rope_mistaken = [&] {
      RopeMistakeBackend rope_backend(*rule.rope_mistake);
      return evaluate(rope_backend, TensorParallelRegion(group, false, rope_backend));
    };
    const ObjectiveResult r = rule.context_parallel_mistake ? mistaken()
                              : rule.rope_mistake           ? rope_mistaken()
                              : rule.mask_added             ? evaluate(added_mask, added_mask_region)
                                                            : evaluate(*backend, region);
    const bool matches =
        compared.empty()
            ? update_matches(r.grads)
            : std::all_of(compared.begin(), compared.end(), [&](int id) {
                const std::string path = id < 0 ? prefix + "loss" : prefix + "grads/" + table[id].name;
                const Recorded expected = id < 0 ? Recorded{{}, {r.loss}, "float64"}
                                                 : Recorded{table[id].shape, r.grads[id], "float64"};
                const Recorded& c = candidate.at(path);
                std::optional<Tolerance> tol = tolerance_of(path);
                if (tol && rule.float32_rope_slack) {
                  tol->relative_l2 = std::max(tol->relative_l2, kFloat32RopeSlack);
                  tol->max_abs_normalized = std::max(tol->max_abs_normalized, kFloat32RopeSlack);
                }
                return tol && c.values.size() == expected.values.size() &&
                       passes(compare_values(expected, c, *tol), *tol);
              });
    if (matches) verdicts.push_back({rule.signature, rule.message});
  }
  return verdicts;
}

}  // namespace touchstone::diff
