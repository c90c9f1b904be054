// The signature checks on the compared entries; the recomputed ones live in hypotheses.cpp.
#include "oracle/diff/signatures.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "model/params.h"
#include "oracle/diff/hypotheses.h"
#include "oracle/diff/layout_signatures.h"
#include "oracle/golden/golden_writer.h"
#include "parallel/context/load_balanced_split.h"

namespace touchstone::diff {

namespace {

std::string fmt(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

// Loss-token count differences that known data-rule mistakes would cause on this batch.
std::vector<Verdict> token_count(const GoldenReader& golden, const DiffResult& result, int64_t step) {
  const Entry* count = nullptr;
  for (const Entry& e : result.entries) {
    if (e.step == step && e.group == "num_loss_tokens" && e.status == Status::kFail) count = &e;
  }
  if (count == nullptr || !count->reason.empty()) return {};
  // A count is an integer: a candidate value that is not one (502.4, or a float beyond 2^53) fails the
  // exact comparison for that reason, and rounding it for the message would print two equal counts.
  const double cand_value = count->metrics.worst_candidate;
  const auto gold = static_cast<int64_t>(std::llround(count->metrics.worst_golden));
  if (!(std::fabs(cand_value) <= 0x1p53) || cand_value != std::round(cand_value)) {
    char text[64];
    std::snprintf(text, sizeof text, "%.15g", cand_value);
    return {{"token_count", std::string("token count is not a whole number: the candidate has ") + text +
                                " loss tokens, the golden batch " + std::to_string(gold) +
                                " (a count averaged or stored in a float format that cannot hold it)"}};
  }
  const auto cand = static_cast<int64_t>(cand_value);
  const int64_t difference = cand - gold;
  const GlobalBatch batch = golden.batch(step);
  const DataConfig& data = golden.config().data;
  // Padding positions, and the last real token of each window whose next position is padding: a loss
  // on padding counts the former, and the latter too when the mask is built from the inputs.
  int64_t padding = 0, before_padding = 0, eos_targets = 0, untrained_eos = 0, boundaries = 0;
  for (int64_t w = 0; w < batch.windows; ++w) {
    for (int64_t i = 0; i < batch.seq; ++i) {
      const auto at = static_cast<size_t>(w * batch.seq + i);
      const bool has_next = i + 1 < batch.seq;
      const int32_t doc = batch.document_ids[at], next_doc = has_next ? batch.document_ids[at + 1] : doc;
      const bool ignored = batch.targets[at] == -100;
      if (ignored && doc == -1) ++padding;
      if (ignored && doc != -1 && next_doc == -1) ++before_padding;
      if (batch.targets[at] == data.eos_token) ++eos_targets;
      if (ignored && has_next && doc != -1 && next_doc == doc && batch.tokens[at + 1] == data.eos_token) {
        ++untrained_eos;
      }
      if (ignored && has_next && doc != -1 && next_doc != -1 && next_doc != doc) ++boundaries;
    }
  }
  std::string why;
  auto add = [&](bool matches, const std::string& text) {
    if (matches && difference != 0) why += (why.empty() ? "; it matches " : ", or ") + text;
  };
  add(difference == padding || difference == padding + before_padding,
      "padding counted in the loss (" + std::to_string(padding) + " padding positions" +
          (difference == padding
               ? std::string()
               : " and the " + std::to_string(before_padding) + " real token(s) before them") +
          ")");
  add(data.eos_loss && difference == -eos_targets,
      "positions whose target is EOS left untrained (data.eos_loss rule flipped, " +
          std::to_string(eos_targets) + " such positions)");
  add(!data.eos_loss && difference == untrained_eos,
      "positions whose target is EOS trained (data.eos_loss rule flipped, " + std::to_string(untrained_eos) +
          " such positions)");
  add(data.document_masking && difference == boundaries,
      "loss across document boundaries (the position whose input is EOS trained, " +
          std::to_string(boundaries) + " such positions)");
  // CP loss scaling: the count of one context-parallel rank's rows (its two chunks of every window,
  // LoadBalancedSplit), not all-reduced over the cp group.
  for (int cp = 2; cp <= 64 && batch.seq % (2 * cp) == 0; cp *= 2) {
    const LoadBalancedSplit split(batch.seq, cp);
    for (int rank = 0; rank < cp; ++rank) {
      int64_t mine = 0;
      for (int32_t target : split.take(batch.targets.data(), rank, batch.windows)) mine += target != -100;
      add(cand == mine,
          "the loss tokens of cp rank " + std::to_string(rank) + " of cp = " + std::to_string(cp) +
              " alone (a count not all-reduced over the context-parallel group: CP loss scaling)");
    }
  }
  return {{"token_count", "token count differs: the candidate has " + std::to_string(cand) +
                              " loss tokens, the golden batch " + std::to_string(gold) + " (" +
                              (difference > 0 ? "+" : "") + std::to_string(difference) +
                              "): a different data or masking rule" + why}};
}

// The first group of the step (initial parameters, gradients, updated parameters, moments) with a
// failing tensor.
Group first_failing_group(const DiffResult& result, int64_t step) {
  for (const char* name : {"init", "grads", "params", "exp_avg", "exp_avg_sq"}) {
    Group group;
    for (const Entry& e : result.entries) {
      if (e.step != step || e.group != name || e.status == Status::kNotCompared) continue;
      group.compared.push_back(&e);
      if (e.status == Status::kFail) group.failing.push_back(&e);
    }
    if (!group.failing.empty()) return group;
  }
  return {};
}

// The least-squares factor c of candidate ~ c x golden is sum(c.g) / sum(g.g); these add one tensor's terms.
void add_scale_terms(const std::vector<double>& c, const std::vector<double>& g, double& cg, double& gg) {
  for (size_t i = 0; i < c.size(); ++i) {
    cg += c[i] * g[i];
    gg += g[i] * g[i];
  }
}

// The candidate tensor divided by `factor` passes against the reference with the entry's tolerance.
bool passes_divided_by(const Recorded& reference, Recorded candidate, double factor,
                       const Tolerance& tolerance) {
  for (double& v : candidate.values) v /= factor;
  return passes(compare_values(reference, candidate, tolerance), tolerance);
}

// One factor on every gradient: least squares over all of them, then each rescaled tensor must pass.
std::vector<Verdict> gradient_scale(Judge& judge, const TensorMap& candidate, const Group& group) {
  if (group.failing.front()->group != "grads") return {};
  double cg = 0, gg = 0;
  std::vector<std::pair<const Entry*, Recorded>> grads;
  for (const Entry* e : group.compared) {
    if (!e->reason.empty()) return {};  // a wrong shape or a NaN is not a scale
    grads.emplace_back(e, reference_of(judge, *e));
    add_scale_terms(candidate.at(e->path).values, grads.back().second.values, cg, gg);
  }
  const double factor = gg > 0 ? cg / gg : 0;
  if (factor == 0 || !std::isfinite(factor)) return {};
  for (const auto& [e, g] : grads) {
    if (!passes_divided_by(g, candidate.at(e->path), factor, e->tolerance)) return {};
  }
  std::string hint;
  auto whole = [](double x) { return std::round(x) >= 2 && std::fabs(x - std::round(x)) < 1e-6 * x; };
  if (whole(1 / factor)) {
    hint = " = 1/" + fmt("%.0f", 1 / factor) +
           ": divided once more, e.g. by the data-parallel size, the context-parallel size or the number of "
           "micro-batches";
  } else if (whole(factor)) {
    hint = " = " + fmt("%.0f", factor) +
           ": a division missing, e.g. by the data-parallel size, or by the context-parallel size (CP loss "
           "scaling: each cp rank's loss summed where the ranks' shares should have been averaged)";
  }
  return {{"gradient_scale",
           "all gradients scaled by one factor: candidate = " + fmt("%.6g", factor) + " x golden" + hint}};
}

// The tied embedding's gradient alone 2^n times the golden one: the all-reduce over the embedding group
// (the first and last pipeline stage, each holding part of the sum) ran n more times than once, as a
// loop over virtual pipeline chunks that reduces once per chunk does. Each extra run doubles the sum.
std::vector<Verdict> tied_embedding_reduced_twice(const GoldenReader& golden, Judge& judge,
                                                  const TensorMap& candidate, const Group& group) {
  if (!golden.config().model.tie_embeddings || group.failing.size() != 1) return {};
  const Entry& e = *group.failing.front();
  if (e.group != "grads" || e.param != golden.table().embedding() || !e.reason.empty()) return {};
  const Recorded g = reference_of(judge, e);
  const Recorded& c = candidate.at(e.path);
  double cg = 0, gg = 0;
  add_scale_terms(c.values, g.values, cg, gg);
  const double extra = gg > 0 ? std::round(std::log2(cg / gg)) : 0;
  if (!(extra >= 1 && extra <= 16)) return {};
  if (!passes_divided_by(g, c, std::exp2(extra), e.tolerance)) return {};
  return {{"tied_embedding_reduced_twice",
           "tied embedding gradient reduced " + fmt("%.0f", extra + 1) + " times: " + e.path + " = " +
               fmt("%.0f", std::exp2(extra)) +
               " x golden, every other gradient right; reduce it over the embedding group (first and last "
               "pipeline stage) once per step, not once per virtual pipeline chunk"}};
}

// Only the tensors of one decoder layer fail, while other layers' tensors pass.
std::vector<Verdict> one_layer(const ParamTable& table, const DiffResult& result, const Group& group,
                               int64_t step) {
  // An updated parameter whose gradient passes is an optimizer matter, not a layer computed wrong.
  if (group.failing.front()->group != "grads") {
    for (const Entry* e : group.failing) {
      const bool gradient_passes =
          std::any_of(result.entries.begin(), result.entries.end(), [&](const Entry& g) {
            return g.step == step && g.group == "grads" && g.param == e->param && g.status == Status::kPass;
          });
      if (gradient_passes) return {};
    }
  }
  std::set<int64_t> layers;
  for (const Entry* e : group.failing) layers.insert(table[e->param].layer);
  if (layers.size() != 1 || *layers.begin() < 0) return {};
  const int64_t layer = *layers.begin();
  const bool others_pass = std::any_of(group.compared.begin(), group.compared.end(), [&](const Entry* e) {
    return e->status == Status::kPass && table[e->param].layer != layer;
  });
  if (!others_pass) return {};
  std::string kinds;
  for (const Entry* e : group.failing) kinds += (kinds.empty() ? "" : ", ") + kind_name(table[e->param].kind);
  return {{"one_layer", "one layer off: among the " + group.failing.front()->group + " of step " +
                            std::to_string(step) + " only layer " + std::to_string(layer) + " fails (" +
                            kinds + ")"}};
}

// FP32 arithmetic inside an FP64 run (Hugging Face's Llama keeps RoPE, RMSNorm and the eager softmax in
// float32 after .to(torch.float64)): every gradient of the step fails with an error of FP32 roundoff's
// size, within a factor kFp32Band of Touchstone's FP32 mode at the same parameters. A wrong rule moves
// gradients by 1e-3 or more, thousands of times FP32 roundoff (about 1e-7).
std::vector<Verdict> fp32_inside_fp64(const GoldenReader& golden, const ToleranceModel& tolerances,
                                      Judge& judge, const DiffResult& result, int64_t step) {
  constexpr double kFp32Band = 100.0;
  // A --tolerance override keeps the premise "every gradient fails" meaningful only while it stays far
  // below FP32 roundoff's relative errors (1e-8 and up): 1e-9 at most, as tight as the file's own 1e-10
  // in effect (a candidate diffed at --tolerance 1e-12 is named as at the file's tolerance).
  constexpr double kTightestOverride = 1e-9;
  const std::optional<double> override_value = tolerances.override_value();
  if (golden.precision() != Precision::kFp64 || tolerances.kind() != "fp64" ||
      (override_value && *override_value > kTightestOverride) || step < 1) {
    return {};
  }
  std::vector<const Entry*> grads;
  for (const Entry& e : result.entries) {
    if (e.step == step && e.group == "grads" && e.status != Status::kNotCompared) grads.push_back(&e);
  }
  if (grads.empty() || judge.anchors().params_after(step - 1) == nullptr) return {};
  const bool all_fail = std::all_of(grads.begin(), grads.end(), [](const Entry* e) {
    return e->status == Status::kFail && e->reason.empty();
  });
  if (!all_fail) return {};
  const StepRecord fp32 = judge.anchors().evaluate_at(step, Precision::kFp32);
  double lowest = std::numeric_limits<double>::infinity(), highest = 0.0;
  for (const Entry* e : grads) {
    const double fp32_error = envelope_error(fp32.grads[e->param], reference_of(judge, *e).values)[0];
    const double ratio = e->metrics.relative_l2 / fp32_error;
    lowest = std::min(lowest, ratio);
    highest = std::max(highest, ratio);
  }
  if (!(lowest >= 1 / kFp32Band && highest <= kFp32Band)) return {};
  return {
      {"fp32_in_fp64",
       "FP32 arithmetic inside an FP64 run: every gradient is off by FP32 roundoff (" + fmt("%.2g", lowest) +
           " to " + fmt("%.2g", highest) +
           " x Touchstone's FP32 mode at the same parameters); look for operations computed in float32, e.g. "
           "Hugging Face's RoPE inv_freq and cos/sin, LlamaRMSNorm, the eager softmax and the labels= loss "
           "(apply touchstone.hf.exact_fp64(model))"}};
}

// The updated parameters of the step match AdamW with one rule changed, on the candidate's own gradients.
std::vector<Verdict> optimizer_rules(const GoldenReader& golden, Judge& judge, const TensorMap& candidate,
                                     const Group& group, int64_t step) {
  if (group.failing.front()->group != "params" || group.failing.front()->basis != Basis::kOptimizer)
    return {};
  const std::optional<OptimizerInputs> inputs = judge.optimizer_inputs(step);
  if (!inputs) return {};
  std::vector<Verdict> verdicts;
  for (const OptimizerRule& rule : mistaken_optimizer_rules()) {
    const ExpectedUpdate expected =
        expected_update(golden.table(), golden.config().optim, *inputs, rule, judge.master());
    const bool matches = std::all_of(group.compared.begin(), group.compared.end(), [&](const Entry* e) {
      if (!e->reason.empty()) return false;
      Recorded reference{golden.table()[e->param].shape, expected.params[e->param], "float64"};
      ElementBounds bounds = expected.bounds[e->param];
      Tolerance tolerance = e->tolerance;
      // A 16-bit copy: the rule's reference rounded and its bounds widened as the judged ones were.
      const Judgment judged = judge.judge(e->path, e->group, e->param, e->step);
      if (judged.copy) {
        tolerance = *judged.unwidened_tolerance;
        judge_as_copy(*judged.copy, reference, tolerance, bounds);
      }
      return passes(compare_values(reference, candidate.at(e->path), tolerance, &bounds), tolerance);
    });
    if (matches) verdicts.push_back({rule.signature, rule.message});
  }
  return verdicts;
}

}  // namespace

std::vector<Verdict> find_signatures(const GoldenReader& golden, const ToleranceModel& tolerances,
                                     const TensorMap& candidate, Judge& judge, DiffResult& result,
                                     const SignatureOptions& options) {
  const int64_t step = result.entries[static_cast<size_t>(result.first_failure)].step;
  std::vector<Verdict> verdicts;
  auto add = [&](std::vector<Verdict> more) {
    for (Verdict& v : more) verdicts.push_back(std::move(v));
  };
  const bool forward_fails = std::any_of(result.entries.begin(), result.entries.end(), [&](const Entry& e) {
    return e.step == step && (e.group == "loss" || e.group == "grads") && e.status == Status::kFail;
  });
  // A candidate with parameters but no loss or gradients: the rules are matched through its update.
  const Entry& first = result.entries[static_cast<size_t>(result.first_failure)];
  const bool update_only = !forward_fails && first.group == "params" && first.basis != Basis::kOptimizer &&
                           judge.anchor(step) != nullptr &&
                           std::none_of(result.entries.begin(), result.entries.end(), [&](const Entry& e) {
                             return e.step == step && (e.group == "loss" || e.group == "grads") &&
                                    e.status != Status::kNotCompared;
                           });
  std::function<bool(const ParamTensors&)> update_matches;
  if (update_only) {
    update_matches = [&](const ParamTensors& rule_grads) {
      OptimizerInputs inputs;
      for (int64_t k = 1; k < step; ++k) inputs.grads.push_back(judge.reanchored_grads(k));
      inputs.grads.push_back(&rule_grads);
      inputs.before = judge.anchor(step);
      if (inputs.before == nullptr ||
          std::find(inputs.grads.begin(), inputs.grads.end(), nullptr) != inputs.grads.end()) {
        return false;
      }
      const ExpectedUpdate expected =
          expected_update(golden.table(), golden.config().optim, inputs, OptimizerRule{}, MasterFormat{});
      return std::all_of(result.entries.begin(), result.entries.end(), [&](const Entry& e) {
        if (e.step != step || e.group != "params" || e.status == Status::kNotCompared) return true;
        const Judgment judged = judge.judge(e.path, e.group, e.param, e.step);
        Recorded reference{golden.table()[e.param].shape, expected.params[e.param], "float64"};
        ElementBounds bounds = judged.bounds;
        Tolerance tolerance = e.tolerance;
        if (judged.copy) {  // a 16-bit copy: the rule's reference rounded, the bounds widened from it
          bounds = judged.unwidened_bounds;
          tolerance = *judged.unwidened_tolerance;
          judge_as_copy(*judged.copy, reference, tolerance, bounds);
        }
        return e.reason.empty() && passes(compare_values(reference, candidate.at(e.path), tolerance,
                                                         bounds.empty() ? nullptr : &bounds),
                                          tolerance);
      });
    };
  }
  if ((forward_fails || update_only) && options.recompute) {
    const ParamTensors* anchor = judge.anchor(step);
    const ParamTensors golden_params =
        anchor ? ParamTensors{} : load_parameters(golden.table(), golden.path(), golden.params_before(step));
    std::map<std::string, Tolerance> judged;
    for (const Entry& e : result.entries) {
      if (e.step == step && e.status != Status::kNotCompared) judged[e.path] = e.tolerance;
    }
    add(match_recomputed_rules(
        golden, anchor ? *anchor : golden_params, candidate, step,
        [&](const std::string& path) -> std::optional<Tolerance> {
          const auto found = judged.find(path);
          if (found == judged.end()) return std::nullopt;
          return found->second;
        },
        update_matches));
  } else if (forward_fails) {
    result.notes.push_back("signatures that recompute the golden step were skipped (recomputation off)");
  }
  add(token_count(golden, result, step));
  add(fp32_inside_fp64(golden, tolerances, judge, result, step));
  const Group group = first_failing_group(result, step);
  if (group.failing.empty()) return verdicts;
  // The most specific first: a layout, one shard, one factor, an optimizer rule, then one layer.
  add(qkv_layout(golden, judge, candidate, group));
  add(tp_shard(golden, judge, candidate, group, options.tp_sizes));
  add(gradient_scale(judge, candidate, group));
  add(tied_embedding_reduced_twice(golden, judge, candidate, group));
  add(optimizer_rules(golden, judge, candidate, group, step));
  add(one_layer(golden.table(), result, group, step));
  return verdicts;
}

}  // namespace touchstone::diff
