// Choosing the reference and tolerance of each dataset: re-anchored, optimizer check or trajectory.
#include "oracle/diff/judge.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/backend.h"
#include "model/params.h"
#include "oracle/golden/golden_writer.h"
#include "oracle/train_step.h"

namespace touchstone::diff {

namespace {

// Marks (sets, never clears) the elements of a gradient that are near zero: within its tolerance's
// max/max|g| of the gradient's largest magnitude. AdamW divides such a gradient by the square root of
// its own tiny second moment, so the update's sign and size there follow rounding noise; the parameter
// check bounds those elements on their own instead of by the tensor's tolerance.
void mark_near_zero(const std::vector<double>& gradient, double max_abs_normalized, std::vector<bool>& near) {
  double largest = 0.0;
  for (double x : gradient) largest = std::max(largest, std::fabs(x));
  for (size_t i = 0; i < std::min(gradient.size(), near.size()); ++i) {
    if (std::fabs(gradient[i]) <= max_abs_normalized * largest) near[i] = true;
  }
}

}  // namespace

std::string basis_name(Basis basis) {
  switch (basis) {
    case Basis::kReanchored:
      return "re-anchored";
    case Basis::kOptimizer:
      return "optimizer";
    case Basis::kTrajectory:
      break;
  }
  return "trajectory";
}

Judge::Judge(const GoldenReader& golden, const ToleranceModel& tolerances, const TensorMap& candidate,
             bool recompute)
    : golden_(golden),
      tolerances_(tolerances),
      candidate_(candidate),
      recompute_(recompute && tolerances.reanchorable()),
      anchors_(golden, tolerances, candidate) {}

void Judge::note_once(int64_t step, const std::string& text) {
  const std::string line = "step " + std::to_string(step) + ": " + text;
  if (noted_.insert(line).second) notes_.push_back(line);
}

const ParamTensors* Judge::anchor(int64_t step) {
  if (!recompute_) return nullptr;
  return anchors_.params_after(step - 1);
}

Judgment Judge::trajectory(const std::string& path, const std::string& group, int param, int64_t step) {
  return as_stored_copy(trajectory_unrounded(path, group, param, step), path, group, param, step);
}

Judgment Judge::judge(const std::string& path, const std::string& group, int param, int64_t step) {
  return as_stored_copy(judge_unrounded(path, group, param, step), path, group, param, step);
}

Judgment Judge::as_stored_copy(Judgment j, const std::string& path, const std::string& group, int param,
                               int64_t step) {
  const auto found = candidate_.find(path);
  if (!j.tolerance || found == candidate_.end()) return j;
  std::optional<StoredCopy> copy = stored_copy_of(group, found->second.dtype);
  if (!copy) return j;
  // An update from the candidate's parameters after step - 1 (the optimizer check, a re-anchored
  // update): when those are a 16-bit copy too, their rounding enters the bound.
  if (group == "params" && j.basis != Basis::kTrajectory && step >= 1) {
    const std::string before = step == 1 ? "params/init/" : "steps/" + std::to_string(step - 1) + "/params/";
    const auto start = candidate_.find(before + golden_.table()[param].name);
    const ParamTensors* params = anchors_.params_after(step - 1);
    if (start != candidate_.end() && params != nullptr && copy_unit_roundoff(start->second.dtype) > 0) {
      copy->start = &(*params)[param];
      copy->start_unit_roundoff = copy_unit_roundoff(start->second.dtype);
      copy->start_subnormal_error = copy_subnormal_error(start->second.dtype);
    }
  }
  j.unwidened_tolerance = j.tolerance;
  j.unwidened_bounds = j.bounds;
  judge_as_copy(*copy, j.reference, *j.tolerance, j.bounds);
  j.copy = std::move(copy);
  const std::string line = copy_note(path.substr(0, path.rfind('/')), j.copy->type);
  if (noted_.insert(line).second) notes_.push_back(line);
  return j;
}

Judgment Judge::trajectory_unrounded(const std::string& path, const std::string& group, int param,
                                     int64_t step) {
  Judgment j;
  j.reference = golden_.read(path);
  const bool integer = j.reference.dtype.rfind("int", 0) == 0 || j.reference.dtype.rfind("uint", 0) == 0;
  j.tolerance = tolerances_.for_path(path, integer);
  if (group == "params" && j.tolerance && tolerances_.envelope() && !tolerances_.override_value()) {
    j.bounds = near_zero_bounds(step, param, j.reference, *j.tolerance);
  }
  return j;
}

std::optional<Tolerance> Judge::anchored_tolerance(const std::vector<double>& low,
                                                   const std::vector<double>& truth, const std::string& path,
                                                   bool integer) const {
  if (integer) return Tolerance{0.0, 0.0};
  if (tolerances_.override_value())
    return Tolerance{*tolerances_.override_value(), *tolerances_.override_value()};
  if (tolerances_.envelope()) return tolerances_.envelope()->tolerance(envelope_error(low, truth));
  return tolerances_.for_path(path, false);
}

Judgment Judge::judge_unrounded(const std::string& path, const std::string& group, int param, int64_t step) {
  static const std::set<std::string> anchored_groups = {"loss", "num_loss_tokens", "token_losses", "grads",
                                                        "grad_norm"};
  if (group == "params") {
    const UpdatedParams& updated = updated_params(step);
    if (updated.basis == Basis::kTrajectory) {
      Judgment j = trajectory_unrounded(path, group, param, step);
      if (updated.golden_anchors) j.basis = Basis::kReanchored;  // the golden update is the re-anchored one
      return j;
    }
    Judgment j;
    j.basis = updated.basis;
    j.reference = Recorded{golden_.table()[param].shape, updated.reference[param],
                           master().digits == 53 ? "float64" : "float32"};
    j.tolerance = updated.tolerances[static_cast<size_t>(param)];
    j.bounds = updated.bounds[static_cast<size_t>(param)];
    return j;
  }
  if (!anchored_groups.count(group) || step < 1) return trajectory_unrounded(path, group, param, step);
  const AnchoredStep* anchored = recompute_ ? anchors_.step(step) : nullptr;
  if (anchored == nullptr) {
    if (recompute_) {
      note_once(
          step,
          "judged against the golden trajectory: the candidate recorded no complete parameters after step " +
              std::to_string(step - 1) + ", which re-anchoring starts from");
    }
    return trajectory_unrounded(path, group, param, step);
  }
  Judgment j;
  if (anchored->golden) {  // the golden file's own step starts from the candidate's parameters
    j = trajectory_unrounded(path, group, param, step);
    j.basis = Basis::kReanchored;
    return j;
  }
  j.basis = Basis::kReanchored;
  const Recorded shape_of = golden_.read(path);
  const bool integer = group == "num_loss_tokens";
  j.reference = Recorded{shape_of.shape, Anchors::value(anchored->truth, group, param), "float64"};
  const std::vector<double> low =
      anchored->low ? Anchors::value(*anchored->low, group, param) : j.reference.values;
  j.tolerance = anchored_tolerance(low, j.reference.values, path, integer);
  if (group == "grad_norm" && anchored->low && j.tolerance && !tolerances_.override_value()) {
    const double error = grad_norm_envelope_error(anchored->low->grads, anchored->truth.grads,
                                                  anchored->low->grad_norm, anchored->truth.grad_norm);
    j.tolerance = tolerances_.envelope()->tolerance({error, error});
  }
  if (group == "loss" && anchored->low && j.tolerance && !tolerances_.override_value()) {
    // One scalar's low-precision error can be near zero by luck (its token losses' errors cancel), so the
    // loss's envelope is taken from the token losses' errors added without cancellation.
    const double spread = loss_envelope_error(position_loss_weights(golden_.config(), golden_.batch(step)),
                                              anchored->low->token_losses, anchored->truth.token_losses,
                                              anchored->low->loss, anchored->truth.loss);
    const Tolerance robust = tolerances_.envelope()->tolerance({spread, spread});
    j.tolerance = Tolerance{std::max(j.tolerance->relative_l2, robust.relative_l2),
                            std::max(j.tolerance->max_abs_normalized, robust.max_abs_normalized)};
  }
  return j;
}

const ParamTensors* Judge::reanchored_grads(int64_t step) {
  const AnchoredStep* anchored = recompute_ ? anchors_.step(step) : nullptr;
  if (anchored == nullptr) return nullptr;
  if (!anchored->golden) return &anchored->truth.grads;
  auto found = golden_grads_.find(step);
  if (found == golden_grads_.end()) {
    const std::string group = "/steps/" + std::to_string(step) + "/grads";
    found = golden_grads_.emplace(step, load_parameters(golden_.table(), golden_.path(), group)).first;
  }
  return &found->second;
}

const ParamTensors* Judge::candidate_grads(int64_t step) {
  auto found = grads_.find(step);
  if (found == grads_.end()) {
    found = grads_
                .emplace(step, complete_tensors(golden_.table(), candidate_,
                                                "steps/" + std::to_string(step) + "/grads/"))
                .first;
  }
  return found->second ? &*found->second : nullptr;
}

std::optional<OptimizerInputs> Judge::optimizer_inputs(int64_t step) {
  OptimizerInputs inputs;
  inputs.before = anchors_.params_after(step - 1);
  if (inputs.before == nullptr || candidate_grads(step) == nullptr) return std::nullopt;
  // Moments the candidate recorded after step - 1 replace the replay of the earlier steps.
  auto found = moments_.find(step - 1);
  if (found == moments_.end()) {
    std::optional<AdamWState> recorded;
    const std::string prefix = "steps/" + std::to_string(step - 1) + "/optimizer/";
    std::optional<ParamTensors> m = complete_tensors(golden_.table(), candidate_, prefix + "exp_avg/");
    std::optional<ParamTensors> v = complete_tensors(golden_.table(), candidate_, prefix + "exp_avg_sq/");
    if (step > 1 && m && v) recorded = AdamWState{std::move(*m), std::move(*v), step - 1};
    found = moments_.emplace(step - 1, std::move(recorded)).first;
  }
  auto recorded_norm = [&](int64_t k) {
    const auto norm = candidate_.find("steps/" + std::to_string(k) + "/grad_norm");
    return norm != candidate_.end() && norm->second.numel() == 1 ? norm->second.values[0]
                                                                 : std::numeric_limits<double>::quiet_NaN();
  };
  if (found->second) {
    inputs.moments = &*found->second;
    inputs.grads = {candidate_grads(step)};
    inputs.norms = {recorded_norm(step)};
    return inputs;
  }
  for (int64_t k = 1; k <= step; ++k) {
    const ParamTensors* grads = candidate_grads(k);
    if (grads == nullptr) return std::nullopt;
    inputs.grads.push_back(grads);
    inputs.norms.push_back(recorded_norm(k));
  }
  return inputs;
}

std::optional<Judge::UpdatedParams> Judge::optimizer_check(int64_t step) {
  const std::optional<OptimizerInputs> inputs = optimizer_inputs(step);
  if (!inputs) return std::nullopt;
  const ParamTable& table = golden_.table();
  ExpectedUpdate expected =
      expected_update(table, golden_.config().optim, *inputs, OptimizerRule{}, master());
  UpdatedParams out;
  out.basis = Basis::kOptimizer;
  out.reference = std::move(expected.params);
  for (int id = 0; id < table.size(); ++id) {
    if (tolerances_.override_value()) {
      const double x = *tolerances_.override_value();
      out.tolerances.emplace_back(Tolerance{x, x});
      out.bounds.emplace_back();
    } else {  // every element on its own bound: the tensor-wide rule judges none
      out.tolerances.emplace_back(Tolerance{0.0, 0.0});
      out.bounds.push_back(std::move(expected.bounds[id]));
    }
  }
  return out;
}

std::optional<Judge::UpdatedParams> Judge::reanchored_update(int64_t step) {
  if (!recompute_) return std::nullopt;
  const ParamTable& table = golden_.table();
  const OptimConfig& optim = golden_.config().optim;
  OptimizerInputs truth_inputs;
  std::vector<ParamTensors> low_grads;
  std::vector<const AnchoredStep*> anchored_steps;
  for (int64_t k = 1; k <= step; ++k) {
    const AnchoredStep* anchored = anchors_.step(k);
    if (anchored == nullptr) return std::nullopt;
    anchored_steps.push_back(anchored);
  }
  // Every step starts from the golden parameters: the golden file's own update is the reference.
  if (std::all_of(anchored_steps.begin(), anchored_steps.end(),
                  [](const AnchoredStep* a) { return a->golden; })) {
    return std::nullopt;
  }
  for (int64_t k = 1; k <= step; ++k) {
    truth_inputs.grads.push_back(reanchored_grads(k));
    const AnchoredStep* anchored = anchored_steps[static_cast<size_t>(k - 1)];
    if (anchored->low) low_grads.push_back(anchored->low->grads);
  }
  truth_inputs.before = anchors_.params_after(step - 1);
  const ExpectedUpdate truth = expected_update(table, optim, truth_inputs, OptimizerRule{}, MasterFormat{});
  UpdatedParams out;
  out.basis = Basis::kReanchored;
  out.reference = truth.params;
  const std::optional<EnvelopeModel>& envelope = tolerances_.envelope();
  if (!envelope || tolerances_.override_value()) {
    for (int id = 0; id < table.size(); ++id) {
      out.tolerances.push_back(
          anchored_tolerance({}, {}, "steps/" + std::to_string(step) + "/params/" + table[id].name, false));
      out.bounds.emplace_back();
    }
    return out;
  }
  // The envelope: Touchstone's own optimizer in the low precision, replayed on its low-precision
  // gradients at the same anchors, against the FP64 update; elements whose gradient lies within the
  // gradients' envelope of zero at some step are bounded by one step's 2 lr R instead.
  const auto backend =
      make_cpu_backend(BackendOptions{envelope->precision, envelope->grad_accumulation_fusion});
  ParamTensors low = *truth_inputs.before;
  for (auto& t : low.tensors) backend->round(TensorRole::kState, t.data(), static_cast<int64_t>(t.size()));
  const ParamTensors before = low;
  AdamWState state = AdamWState::zeros_like(low);
  for (int64_t k = 1; k <= step; ++k) {
    ParamTensors scratch = k == step ? before : low;  // only update `step` acts on the anchor
    const ParamTensors& g = low_grads[static_cast<size_t>(k - 1)];
    adamw_step(*backend, table, optim, learning_rate(optim, k),
               clip_coefficient(global_norm(g), optim.clip_grad), g, scratch, state);
    if (k == step) low = std::move(scratch);
  }
  std::vector<std::vector<bool>> near(static_cast<size_t>(table.size()));
  for (int id = 0; id < table.size(); ++id)
    near[static_cast<size_t>(id)].assign(truth.params[id].size(), false);
  for (int64_t k = 1; k <= step; ++k) {
    const AnchoredStep* anchored = anchors_.step(k);
    for (int id = 0; id < table.size(); ++id) {
      const std::vector<double>& g = anchored->truth.grads[id];
      const Tolerance tol = envelope->tolerance(envelope_error(anchored->low->grads[id], g));
      mark_near_zero(g, tol.max_abs_normalized, near[static_cast<size_t>(id)]);
    }
  }
  const double loose = 2 * truth.lr * adam_step_bound(optim, step);
  const MasterFormat format = master();
  for (int id = 0; id < table.size(); ++id) {
    std::vector<double> low_kept, truth_kept;
    ElementBounds bounds(truth.params[id].size(), kNoElementBound);
    bool any_near = false;
    for (size_t i = 0; i < bounds.size(); ++i) {
      if (near[static_cast<size_t>(id)][i]) {
        const double size =
            std::max(std::fabs(truth.params[id][i]), std::fabs((*truth_inputs.before)[id][i]));
        bounds[i] = loose + 2 * (size > 0 ? std::ldexp(1.0, std::ilogb(size) - (format.digits - 1)) : 0.0);
        any_near = true;
      } else {
        low_kept.push_back(low[id][i]);
        truth_kept.push_back(truth.params[id][i]);
      }
    }
    out.tolerances.push_back(envelope->tolerance(envelope_error(low_kept, truth_kept)));
    out.bounds.push_back(any_near ? std::move(bounds) : ElementBounds{});
  }
  return out;
}

bool Judge::all_golden_before(int64_t step) {
  for (int64_t k = 1; k <= step; ++k) {
    const AnchoredStep* anchored = anchors_.step(k);
    if (anchored == nullptr || !anchored->golden) return false;
  }
  return true;
}

const Judge::UpdatedParams& Judge::updated_params(int64_t step) {
  auto found = updated_.find(step);
  if (found != updated_.end()) return found->second;
  std::optional<UpdatedParams> updated = optimizer_check(step);
  if (!updated) updated = reanchored_update(step);
  const AnchoredStep* anchored = recompute_ ? anchors_.step(step) : nullptr;
  if (!updated && anchored != nullptr && anchored->golden && all_golden_before(step)) {
    updated = UpdatedParams{};  // the golden update from the golden parameters: the trajectory is exact
    updated->golden_anchors = true;
  } else if (!updated) {
    updated = UpdatedParams{};
    note_once(step,
              std::string("updated parameters judged against the golden trajectory: ") +
                  (recompute_ ? "the candidate recorded neither its gradients of steps 1.." +
                                    std::to_string(step) + " nor its parameters after every earlier step"
                              : "recomputation is off"));
  }
  return updated_.emplace(step, std::move(*updated)).first->second;
}

ElementBounds Judge::near_zero_bounds(int64_t step, int param, const Recorded& golden_params,
                                      const Tolerance& params_tolerance) {
  const ParamTable& table = golden_.table();
  const OptimConfig& optim = golden_.config().optim;
  std::vector<bool> near(golden_params.values.size(), false);
  double loose = 0.0;
  for (int64_t k = 1; k <= step; ++k) {
    const std::string path = "steps/" + std::to_string(k) + "/grads/" + table[param].name;
    if (!golden_.has(path)) return {};
    const Recorded g = golden_.read(path);
    const std::optional<Tolerance> tol = tolerances_.for_path(path, false);
    if (!tol) return {};
    mark_near_zero(g.values, tol->max_abs_normalized, near);
    loose += 2 * learning_rate(optim, k) * adam_step_bound(optim, k);
  }
  double largest = 0.0;
  for (double x : golden_params.values) largest = std::max(largest, std::fabs(x));
  const double elementwise = params_tolerance.max_abs_normalized * largest;
  ElementBounds bounds(near.size(), kNoElementBound);
  bool any = false;
  for (size_t i = 0; i < near.size(); ++i) {
    if (near[i]) {
      bounds[i] = loose + elementwise;
      any = true;
    }
  }
  return any ? bounds : ElementBounds{};
}

}  // namespace touchstone::diff
