// Re-anchoring: each step judged on its own (docs/diffing.md "Each step on its own").
//
// From step 2 on, a candidate's gradients are taken at its own parameters, which have drifted from the
// golden trajectory by the rounding of every earlier step. Comparing them with the golden file mixes
// this step's error with that drift. When the candidate recorded its parameters after step s-1,
// Touchstone instead evaluates step s itself at those parameters on the golden batch of step s:
//   - in FP64 (the golden file's precision for a file without an envelope): the values the candidate's
//     loss, loss-token count, token losses, gradients and gradient norm are compared with;
//   - for a golden file with a precision envelope, also in that precision, so that each dataset's
//     tolerance is the envelope's k x (the low-precision error at these parameters) + floor.
// The first failing step is then the step where the error began.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/param_table.h"
#include "oracle/diff/tolerance.h"
#include "oracle/golden/golden_reader.h"
#include "oracle/golden/recorded.h"
#include "oracle/train_step.h"

namespace touchstone::diff {

// Every tensor of the parameter table under `prefix` ("steps/2/params/", "params/init/") of the
// candidate, in table order; none when one is missing or has another number of elements.
std::optional<ParamTensors> complete_tensors(const ParamTable& table, const TensorMap& candidate,
                                             const std::string& prefix);

// Touchstone's step `step` at the parameters the candidate recorded after step - 1.
struct AnchoredStep {
  int64_t step = 0;
  // The candidate's parameters are bitwise the golden ones the step started from: the golden file's
  // step is the re-anchored step, and `truth` and `low` are left empty (read the golden file).
  bool golden = false;
  StepRecord truth;               // FP64 (or the golden file's precision without an envelope); full gradients
  std::optional<StepRecord> low;  // the envelope's precision, for a golden file with an envelope
};

class Anchors {
 public:
  // `tolerances` decides the precisions: FP64 and the envelope's, or the golden file's own.
  Anchors(const GoldenReader& golden, const ToleranceModel& tolerances, const TensorMap& candidate);

  // The candidate's full parameters after `step` when it recorded every tensor of the table; null
  // otherwise. After step 0: its /params/init, or else the golden initial parameters it loaded.
  const ParamTensors* params_after(int64_t step);

  // Step `step` evaluated at params_after(step - 1), computed once; null without those parameters.
  const AnchoredStep* step(int64_t step);

  // The anchored value of a dataset of step `step` ("loss", "num_loss_tokens", "token_losses",
  // "grad_norm", or the gradient of parameter `param`) in `record`, shaped like the golden dataset.
  static std::vector<double> value(const StepRecord& record, const std::string& group, int param);

  // Step `step` at params_after(step - 1) in another precision (fp32 or bf16), not cached: what a
  // signature compares the candidate's error with. Throws when there are no such parameters.
  StepRecord evaluate_at(int64_t step, Precision precision);

  double seconds() const { return seconds_; }  // time spent evaluating steps
  int64_t evaluated() const { return static_cast<int64_t>(steps_.size()); }

 private:
  StepRecord evaluate(const ParamTensors& params, int64_t step, Precision precision,
                      bool grad_accumulation_fusion) const;

  const GoldenReader& golden_;
  const ToleranceModel& tolerances_;
  const TensorMap& candidate_;
  std::map<int64_t, std::optional<ParamTensors>> params_;
  std::map<int64_t, std::unique_ptr<AnchoredStep>> steps_;  // null: no anchor for that step
  double seconds_ = 0.0;
};

}  // namespace touchstone::diff
