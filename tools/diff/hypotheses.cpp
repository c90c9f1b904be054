// The alternative rules, evaluated on the golden batch from the parameters the step started from.
#include "tools/diff/hypotheses.h"

#include <memory>

#include "kernels/backend.h"
#include "model/params.h"
#include "model/transformer.h"
#include "oracle/train_step.h"
#include "parallel/single_rank_group.h"
#include "parallel/tensor/regions.h"
#include "tools/diff/hf_names.h"

namespace touchstone::diff {

namespace {

struct Rule {
  std::string signature, message;
  bool document_masking;
  LossNormalization normalization;
  bool positions_from_zero = false;  // position ids 0..T-1 in every window instead of the recorded ones
  bool qkv_read_separate = false;    // linear_qkv rows read as [q heads; k heads; v heads]
};

std::vector<Rule> rules_for(const Config& config) {
  const bool masking = config.data.document_masking;
  const std::string norm = config.train.loss_normalization;
  const LossNormalization golden_norm = parse_loss_normalization(norm);
  const bool global = golden_norm == LossNormalization::kGlobalTokenMean;
  const std::string other = global ? "per_microbatch_mean" : "global_token_mean";
  std::vector<Rule> rules;
  rules.push_back({"loss_normalization",
                   "wrong loss normalisation: the candidate matches " + other +
                       (global ? " (the mean of the micro-batch means, micro_batch_size " +
                                     std::to_string(config.train.micro_batch_size) + ")"
                               : " (all token losses / all loss tokens)") +
                       " on the golden batch; the golden run uses " + norm,
                   masking, global ? LossNormalization::kPerMicrobatchMean : LossNormalization::kGlobalTokenMean});
  if (masking) {
    rules.push_back({"document_mask_missing",
                     "document mask missing: the candidate matches plain causal attention across documents "
                     "(position ids as recorded, reset per document)",
                     false, golden_norm});
    rules.push_back({"document_mask_missing_positions_not_reset",
                     "document mask missing and position ids not reset: the candidate matches causal attention "
                     "across documents with positions 0..T-1 in every window",
                     false, golden_norm, true});
  } else {
    rules.push_back({"document_mask_applied",
                     "document mask applied: the candidate matches per-document attention, the golden run has "
                     "data.document_masking = false",
                     true, golden_norm});
  }
  rules.push_back({"qkv_grouping",
                   "QKV rows in the wrong grouping: the candidate matches a model that reads linear_qkv as "
                   "[all query heads; all key heads; all value heads] instead of per KV group [its query heads; "
                   "key; value]",
                   masking, golden_norm, false, true});
  return rules;
}

}  // namespace

std::vector<Verdict> match_recomputed_rules(const Golden& golden, const ToleranceModel& tolerances,
                                            const TensorMap& candidate, int64_t step) {
  const std::string prefix = "steps/" + std::to_string(step) + "/";
  const ParamTable& table = golden.table();
  std::vector<std::string> compared;  // candidate loss and gradient paths of the step
  if (candidate.count(prefix + "loss")) compared.push_back(prefix + "loss");
  for (const ParamSpec& spec : table.specs()) {
    if (candidate.count(prefix + "grads/" + spec.name)) compared.push_back(prefix + "grads/" + spec.name);
  }
  if (step < 1 || compared.empty()) return {};

  const Config& config = golden.config();
  const ParamTensors params = load_parameters(table, golden.path(), golden.params_before(step));
  const GlobalBatch batch = golden.batch(step);
  std::unique_ptr<Backend> backend = make_cpu_backend();
  SingleRankGroup group("tp");
  const TensorParallelRegion region(group, false, *backend);
  const StageRange whole{0, config.model.num_layers, true, true};

  std::vector<Verdict> verdicts;
  for (const Rule& rule : rules_for(config)) {
    GlobalBatch b = batch;
    if (rule.positions_from_zero) {
      for (size_t i = 0; i < b.position_ids.size(); ++i) {
        b.position_ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) % b.seq);
      }
    }
    ParamTensors p = params;
    const int64_t H = config.model.hidden_size;
    if (rule.qkv_read_separate) {
      for (int64_t l = 0; l < config.model.num_layers; ++l) {
        const int id = table.layer(l).qkv;
        p[id] = qkv_grouped_from_separate(config.model, p[id], H);
      }
    }
    const Transformer model(config.model, rule.document_masking, table, *backend, region, whole);
    ObjectiveResult r = evaluate_objective(model, table, p, b, config.train.micro_batch_size, rule.normalization, true);
    if (rule.qkv_read_separate) {
      for (int64_t l = 0; l < config.model.num_layers; ++l) {
        const int id = table.layer(l).qkv;
        r.grads[id] = qkv_separate_from_grouped(config.model, r.grads[id], H);
      }
    }
    bool all_pass = true;
    for (const std::string& path : compared) {
      const Recorded& c = candidate.at(path);
      Recorded expected{{}, {r.loss}, "float64"};
      if (path != prefix + "loss") {
        const int id = table.find(path.substr(prefix.size() + 6));
        expected = Recorded{table[id].shape, r.grads[id], "float64"};
      }
      const std::optional<Tolerance> tol = tolerances.for_path(path, false);
      if (!tol || c.values.size() != expected.values.size() || !passes(compare_values(expected, c, *tol), *tol)) {
        all_pass = false;
        break;
      }
    }
    if (all_pass) verdicts.push_back({rule.signature, rule.message});
  }
  return verdicts;
}

}  // namespace touchstone::diff
