// What each dataset of a candidate is compared with (docs/diffing.md "Each step on its own"):
//
//   basis        reference                                              used for
//   re-anchored  Touchstone's step s at the candidate's parameters      loss, loss-token count, token
//                after s-1 (reanchor.h); tolerance from the envelope    losses, gradients, gradient norm;
//                measured at those parameters                           parameters of a params-only
//                                                                       candidate (AdamW on the
//                                                                       re-anchored gradients)
//   optimizer    AdamW applied to the candidate's parameters after s-1  updated parameters, when the
//                and its own gradients (optimizer_check.h), bounded     candidate recorded the gradients
//                per element by the rounding of the update              of steps 1..s
//   trajectory   the golden file's value and tolerance                  the initial parameters, the
//                                                                       learning rate, moments, and
//                                                                       every step without an anchor
//
// Under the trajectory with a precision envelope, a parameter element whose golden gradient lies
// within the envelope's noise of zero at some step k <= s is bounded by 2 sum_k lr_k R(k) instead
// (R: adam_step_bound), since Adam's update of such an element may flip sign (docs/precision.md).
//
// A candidate's parameters stored as a 16-bit copy (bfloat16, float16) are judged, whatever the basis,
// against the reference rounded to that type with the tolerance widened by one such rounding on each
// side (stored_copy.h); the report says so in a note per group.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "oracle/diff/metrics.h"
#include "oracle/diff/optimizer_check.h"
#include "oracle/diff/reanchor.h"
#include "oracle/diff/stored_copy.h"
#include "oracle/diff/tolerance.h"
#include "oracle/golden/golden_reader.h"

namespace touchstone::diff {

enum class Basis { kTrajectory, kReanchored, kOptimizer };
std::string basis_name(Basis basis);  // "trajectory", "re-anchored", "optimizer"

struct Judgment {
  Basis basis = Basis::kTrajectory;
  Recorded reference;
  std::optional<Tolerance> tolerance;  // none: the dataset is not compared
  ElementBounds bounds;                // empty: the tensor-wide rule for every element
  // A 16-bit copy: `reference`, `tolerance` and `bounds` above are already rounded and widened; a
  // signature judging the candidate against a reference of its own applies judge_as_copy(*copy, ...)
  // to it with the tolerance and bounds as they were before the widening.
  std::optional<StoredCopy> copy;
  std::optional<Tolerance> unwidened_tolerance;
  ElementBounds unwidened_bounds;
};

class Judge {
 public:
  // `recompute` false: every step against the trajectory (--no-recompute).
  Judge(const GoldenReader& golden, const ToleranceModel& tolerances, const TensorMap& candidate,
        bool recompute);

  // The dataset `path` of group `group` (parameter `param`, -1 for scalars) of step `step`.
  Judgment judge(const std::string& path, const std::string& group, int param, int64_t step);

  // The golden file's value and tolerance (the trajectory), for reports and fallbacks.
  Judgment trajectory(const std::string& path, const std::string& group, int param, int64_t step);

  // The inputs of the optimizer check of update `step` when the candidate recorded them.
  std::optional<OptimizerInputs> optimizer_inputs(int64_t step);
  MasterFormat master() const { return master_format(tolerances_.master_precision()); }

  // The FP64 gradients of step `step` at the candidate's parameters after step - 1 (the golden file's
  // when those are bitwise the golden ones); null without them.
  const ParamTensors* reanchored_grads(int64_t step);

  // The parameters Touchstone evaluates step `step` at, when re-anchoring is possible.
  const ParamTensors* anchor(int64_t step);
  Anchors& anchors() { return anchors_; }

  // Why steps fell back to the trajectory, and which groups were judged as 16-bit copies, one line each.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  struct UpdatedParams {
    Basis basis = Basis::kTrajectory;
    bool golden_anchors = false;  // every step started from the golden parameters: the trajectory is exact
    ParamTensors reference;
    std::vector<ElementBounds> bounds;  // per parameter id; empty: tensor rule
    std::vector<std::optional<Tolerance>> tolerances;
  };
  const UpdatedParams& updated_params(int64_t step);
  Judgment judge_unrounded(const std::string& path, const std::string& group, int param, int64_t step);
  Judgment trajectory_unrounded(const std::string& path, const std::string& group, int param, int64_t step);
  // Rounds and widens `j` when the candidate's `path` is a 16-bit copy (a no-op otherwise).
  Judgment as_stored_copy(Judgment j, const std::string& path, const std::string& group, int param,
                          int64_t step);
  bool all_golden_before(int64_t step);  // steps 1..step all start from bitwise golden parameters
  std::optional<UpdatedParams> optimizer_check(int64_t step);
  std::optional<UpdatedParams> reanchored_update(int64_t step);
  ElementBounds near_zero_bounds(int64_t step, int param, const Recorded& golden_params,
                                 const Tolerance& params_tolerance);
  std::optional<Tolerance> anchored_tolerance(const std::vector<double>& low,
                                              const std::vector<double>& truth, const std::string& path,
                                              bool integer) const;
  const ParamTensors* candidate_grads(int64_t step);
  void note_once(int64_t step, const std::string& text);

  const GoldenReader& golden_;
  const ToleranceModel& tolerances_;
  const TensorMap& candidate_;
  bool recompute_;
  Anchors anchors_;
  std::map<int64_t, UpdatedParams> updated_;
  std::map<int64_t, std::optional<ParamTensors>> grads_;
  std::map<int64_t, ParamTensors> golden_grads_;
  std::map<int64_t, std::optional<AdamWState>> moments_;
  std::set<std::string> noted_;
  std::vector<std::string> notes_;
};

}  // namespace touchstone::diff
