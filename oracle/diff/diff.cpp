// The diff walk: which datasets to compare, in which order, and the comparison of each.
#include "oracle/diff/diff.h"

#include <algorithm>
#include <limits>
#include <set>

#include "common/errors.h"
#include "oracle/diff/signatures.h"

namespace touchstone::diff {

namespace {

constexpr char kNoTolerance[] = "the golden file records no tolerance for it";

struct Item {
  Item(std::string p, std::string g, std::string n, int id = -1, bool ext = false)
      : path(std::move(p)), group(std::move(g)), name(std::move(n)), param(id), extension(ext) {}
  std::string path, group, name;
  int param;
  bool extension;  // a Touchstone extension: listed only when the candidate has its group
};

std::vector<Item> items_of_step(const ParamTable& table, int64_t step) {
  std::vector<Item> items;
  const std::vector<int> order = params_in_flow_order(table);
  auto tensors = [&](const std::string& prefix, const std::string& group, bool extension) {
    for (int id : order) {
      items.emplace_back(prefix + "/" + table[id].name, group, table[id].name, id, extension);
    }
  };
  if (step == 0) {
    tensors("params/init", "init", false);
    return items;
  }
  const std::string s = "steps/" + std::to_string(step);
  for (const char* scalar : {"loss", "num_loss_tokens"}) items.emplace_back(s + "/" + scalar, scalar, scalar);
  items.emplace_back(s + "/token_losses", "token_losses", "token_losses", -1, true);
  tensors(s + "/grads", "grads", false);
  for (const char* scalar : {"grad_norm", "lr"}) items.emplace_back(s + "/" + scalar, scalar, scalar);
  tensors(s + "/params", "params", false);
  tensors(s + "/optimizer/exp_avg", "exp_avg", true);
  tensors(s + "/optimizer/exp_avg_sq", "exp_avg_sq", true);
  return items;
}

// The step a candidate path belongs to: 0 for params/init, s for steps/<s>/..., -1 otherwise.
int64_t step_of(const std::string& path) {
  if (path.rfind("params/init/", 0) == 0) return 0;
  if (path.rfind("steps/", 0) != 0) return -1;
  const size_t slash = path.find('/', 6);
  try {
    return slash == std::string::npos ? -1 : std::stoll(path.substr(6, slash - 6));
  } catch (const std::exception&) {
    return -1;
  }
}

bool same_shape(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  auto scalar = [](const std::vector<int64_t>& s) { return s.empty() || s == std::vector<int64_t>{1}; };
  return a == b || (scalar(a) && scalar(b));
}

Entry compare_item(const GoldenReader& golden, const Candidate& candidate, Judge& judge,
                   const std::string& tolerance_kind, const Item& item, int64_t step) {
  Entry e;
  e.path = item.path;
  e.step = step;
  e.group = item.group;
  e.name = item.name;
  e.param = item.param;
  if (item.param >= 0) {
    e.layer = golden.table()[item.param].layer;
    e.kind = kind_name(golden.table()[item.param].kind);
  }
  const auto found = candidate.tensors.find(item.path);
  if (found == candidate.tensors.end()) {
    const Recorded reference = golden.read(item.path);
    e.integer = reference.dtype.rfind("int", 0) == 0 || reference.dtype.rfind("uint", 0) == 0;
    e.reason = "missing in the candidate";
    return e;
  }
  const Judgment judgment = judge.judge(item.path, item.group, item.param, step);
  e.basis = judgment.basis;
  e.integer = item.group == "num_loss_tokens";
  if (!judgment.tolerance) {
    e.reason = kNoTolerance + (" (tolerance model " + tolerance_kind + "); a tolerance override compares it");
    return e;
  }
  e.tolerance = *judgment.tolerance;
  const Recorded& c = found->second;
  if (!same_shape(c.shape, judgment.reference.shape)) {
    e.status = Status::kFail;
    e.reason =
        "shape " + shape_text(c.shape) + ", the golden tensor is " + shape_text(judgment.reference.shape);
    return e;
  }
  e.metrics = compare_values(judgment.reference, c, e.tolerance,
                             judgment.bounds.empty() ? nullptr : &judgment.bounds);
  e.status = passes(e.metrics, e.tolerance) ? Status::kPass : Status::kFail;
  if (e.metrics.non_finite > 0) {
    e.reason = std::to_string(e.metrics.non_finite) + " non-finite candidate value(s), the first at " +
               shape_text(e.metrics.first_non_finite);
  }
  if (e.basis != Basis::kTrajectory) {  // the golden file's view, for information
    const Judgment golden_view = judge.trajectory(item.path, item.group, item.param, step);
    if (golden_view.tolerance) {
      e.trajectory = compare_values(golden_view.reference, c, *golden_view.tolerance,
                                    golden_view.bounds.empty() ? nullptr : &golden_view.bounds);
      e.trajectory_passes = passes(*e.trajectory, *golden_view.tolerance);
    }
  }
  return e;
}

}  // namespace

std::vector<int> params_in_flow_order(const ParamTable& table) {
  std::vector<int> order;
  if (table.output() != table.embedding()) order.push_back(table.output());
  order.push_back(table.final_norm());
  const auto layers = std::count_if(table.specs().begin(), table.specs().end(),
                                    [](const ParamSpec& p) { return p.kind == ParamKind::kInputNorm; });
  for (int64_t l = layers; l-- > 0;) {
    const LayerParamIds& ids = table.layer(l);
    for (int id : {ids.fc2, ids.fc1, ids.pre_mlp_norm, ids.proj, ids.qkv, ids.input_norm}) {
      order.push_back(id);
    }
  }
  order.push_back(table.embedding());
  return order;
}

std::string kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::kEmbedding:
      return "embedding";
    case ParamKind::kInputNorm:
      return "input_norm";
    case ParamKind::kQkv:
      return "qkv";
    case ParamKind::kProj:
      return "proj";
    case ParamKind::kPreMlpNorm:
      return "pre_mlp_norm";
    case ParamKind::kFc1:
      return "fc1";
    case ParamKind::kFc2:
      return "fc2";
    case ParamKind::kFinalNorm:
      return "final_norm";
    case ParamKind::kOutput:
      return "output";
  }
  return "other";
}

int DiffResult::count(Status status) const {
  return static_cast<int>(
      std::count_if(entries.begin(), entries.end(), [&](const Entry& e) { return e.status == status; }));
}

namespace {

// The steps to walk: those the candidate holds (0 for its initial parameters), or the one asked for.
std::set<int64_t> steps_to_compare(const GoldenReader& golden, const Candidate& candidate,
                                   const AnalysisOptions& options, std::vector<std::string>& notes) {
  const auto recorded = [&](int64_t s) {
    return s == 0 || std::find(golden.steps().begin(), golden.steps().end(), s) != golden.steps().end();
  };
  if (options.step && !recorded(*options.step)) {
    throw InputError(golden.path() + ": step " + std::to_string(*options.step) + " is not recorded");
  }
  std::set<int64_t> steps, unrecorded;
  for (const auto& [path, tensor] : candidate.tensors) {
    const int64_t s = step_of(path);
    if (s < 0 || (options.step && *options.step != s)) continue;
    (recorded(s) ? steps : unrecorded).insert(s);
  }
  for (int64_t s : unrecorded) {
    notes.push_back("candidate step " + std::to_string(s) +
                    " is not recorded in the golden file: not compared");
  }
  return steps;
}

// The first failing entry in data-flow order, -1 when none fails.
int first_failure(const std::vector<Entry>& entries) {
  const auto it =
      std::find_if(entries.begin(), entries.end(), [](const Entry& e) { return e.status == Status::kFail; });
  return it == entries.end() ? -1 : static_cast<int>(it - entries.begin());
}

}  // namespace

namespace {

// Groups of tensors the candidate holds only in part: what it left out was never checked.
std::vector<std::string> partial_groups(const std::vector<Entry>& entries,
                                        const std::vector<std::string>& notes) {
  std::vector<std::string> partial;
  for (size_t i = 0; i < entries.size();) {
    size_t end = i;
    std::vector<std::string> missing;
    size_t tensors = 0;
    while (end < entries.size() && entries[end].step == entries[i].step &&
           entries[end].group == entries[i].group) {
      if (entries[end].param >= 0) {
        ++tensors;
        if (entries[end].reason == "missing in the candidate") missing.push_back(entries[end].name);
      }
      ++end;
    }
    if (!missing.empty() && missing.size() < tensors) {
      const Entry& e = entries[i];
      std::string text =
          (e.step == 0 ? std::string("params/init") : "steps/" + std::to_string(e.step) + "/" + e.group) +
          ": " + std::to_string(missing.size()) + " of " + std::to_string(tensors) + " tensors missing (" +
          missing.front() + (missing.size() > 1 ? ", ..." : "") + ")";
      partial.push_back(text);
    }
    i = end;
  }
  if (!partial.empty()) {
    const auto ignored = std::find_if(notes.begin(), notes.end(), [](const std::string& n) {
      return n.rfind("ignored", 0) == 0 || n.find("no counterpart") != std::string::npos;
    });
    if (ignored != notes.end()) {
      partial.push_back("likely cause: candidate names that match no golden tensor, e.g. " + *ignored +
                        " (a bare LlamaModel saves names without the 'model.' prefix)");
    }
  }
  return partial;
}

std::string judgment_line(const std::vector<Entry>& entries, bool recompute) {
  std::set<int64_t> anchored, optimizer, trajectory;
  for (const Entry& e : entries) {
    if (e.status == Status::kNotCompared || e.step == 0 || e.group == "lr") continue;
    (e.basis == Basis::kReanchored  ? anchored
     : e.basis == Basis::kOptimizer ? optimizer
                                    : trajectory)
        .insert(e.step);
  }
  auto list = [](const std::set<int64_t>& steps) {
    std::string text;
    for (int64_t s : steps) text += (text.empty() ? "" : ", ") + std::to_string(s);
    return text;
  };
  std::string line;
  if (!anchored.empty()) line += "re-anchored at the candidate's parameters: steps " + list(anchored);
  if (!optimizer.empty()) {
    line += (line.empty() ? "" : "; ") + std::string("updated parameters by the optimizer check: steps ") +
            list(optimizer);
  }
  if (!trajectory.empty()) {
    line += (line.empty() ? "" : "; ") +
            std::string("against the golden trajectory (errors of earlier steps included): steps ") +
            list(trajectory) + (recompute ? "" : " (recomputation off)");
  }
  return line.empty() ? "nothing compared per step" : line;
}

}  // namespace

double DiffResult::worst_tolerance_ratio(int64_t step, const std::string& group) const {
  double worst = 0.0;
  for (const Entry& e : entries) {
    if (e.step == step && e.group == group && e.status != Status::kNotCompared) {
      worst = std::max(
          worst, e.reason.empty() ? e.metrics.tolerance_ratio : std::numeric_limits<double>::infinity());
    }
  }
  return worst;
}

DiffResult run_analysis(const std::string& golden_path, const std::string& candidate_path,
                        const AnalysisOptions& options) {
  const GoldenReader golden(golden_path);
  const ToleranceModel tolerances(golden.reader(), options.tolerance);
  const Candidate candidate = load_candidate(candidate_path, options.candidate, golden);
  DiffResult result;
  result.golden_path = golden_path;
  result.candidate_path = candidate_path;
  result.candidate_format = candidate.format;
  result.candidate_generator = candidate.generator;
  result.golden_precision = option_name(golden.precision());
  result.tolerance_kind = tolerances.kind();
  result.tolerance_model = tolerances.model_json();
  result.tolerance_text = tolerances.describe();
  result.tolerance_override = options.tolerance;
  result.num_layers = golden.config().model.num_layers;
  result.notes = golden.notes();
  result.notes.insert(result.notes.end(), candidate.notes.begin(), candidate.notes.end());
  result.allow_partial = options.allow_partial;

  Judge judge(golden, tolerances, candidate.tensors, options.recompute);
  const std::set<int64_t> steps = steps_to_compare(golden, candidate, options, result.notes);
  std::set<std::string> used;
  for (int64_t s : steps) {
    for (const Item& item : items_of_step(golden.table(), s)) {
      if (!golden.has(item.path)) continue;
      if (item.extension) {
        const std::string prefix = item.param < 0 ? item.path : item.path.substr(0, item.path.rfind('/') + 1);
        const auto next = candidate.tensors.lower_bound(prefix);
        if (next == candidate.tensors.end() || next->first.rfind(prefix, 0) != 0) continue;
      }
      used.insert(item.path);
      result.entries.push_back(compare_item(golden, candidate, judge, tolerances.kind(), item, s));
    }
  }
  for (const auto& [path, tensor] : candidate.tensors) {
    if (!used.count(path) && steps.count(step_of(path))) {
      result.notes.push_back("candidate dataset " + path +
                             " has no counterpart in the golden schema: ignored");
    }
  }
  // The loss-token count alone is no comparison: it is exact whatever the tolerances.
  const bool compared = std::any_of(result.entries.begin(), result.entries.end(), [](const Entry& e) {
    return e.status != Status::kNotCompared && !e.integer;
  });
  if (!compared) {
    const bool untolerated = std::any_of(result.entries.begin(), result.entries.end(),
                                         [](const Entry& e) { return e.reason.rfind(kNoTolerance, 0) == 0; });
    if (untolerated) {
      throw NoToleranceError(golden_path +
                             ": records no tolerance for any dataset the candidate holds (tolerance model " +
                             tolerances.kind() + ")");
    }
    throw InputError(candidate_path + ": holds nothing to compare with " + golden_path +
                     " (neither the loss nor any tensor of a recorded step" +
                     (options.step ? " " + std::to_string(*options.step) : std::string()) + ")");
  }
  for (const std::string& note : judge.notes()) result.notes.push_back(note);
  result.judgment = judgment_line(result.entries, options.recompute);
  result.partial = partial_groups(result.entries, result.notes);
  result.first_failure = first_failure(result.entries);
  if (result.first_failure >= 0) {
    const SignatureOptions signature_options{options.tp_sizes, options.recompute};
    result.verdicts =
        find_signatures(golden, tolerances, candidate.tensors, judge, result, signature_options);
  }
  result.replicas_disagree = candidate.replica_disagreements;
  if (!result.replicas_disagree.empty()) {
    result.verdicts.push_back(
        {"cp_replicas_disagree",
         "the context-parallel ranks' copies disagree (" + std::to_string(result.replicas_disagree.size()) +
             " tensors, first " + result.replicas_disagree.front() +
             "): parameters and gradients are the same on every cp rank once the gradients are reduced over "
             "dp x cp; gradients not all-reduced over the cp group leave each rank its own rows' share"});
  }
  result.recompute_seconds = judge.anchors().seconds();
  return result;
}

}  // namespace touchstone::diff
