// The optimizer as an operator (docs/precision.md "The optimizer check").
//
// The parameters a candidate recorded after update s are judged against Touchstone's AdamW applied to
// the candidate's own parameters after update s-1 and its own gradients: clipping by the global norm
// of each step's gradients, the learning rate of the golden schedule, weight decay only on the tensors
// the parameter table marks (2-D), bias correction, and moments replayed from the candidate's gradients
// of steps 1..s (or continued from the moments it recorded after s-1). Gradient noise is not amplified:
// both sides start from the same parameters and use the same gradients, so what remains is the
// rounding of the update formula in the master weights' format, bounded per element.
//
// The same arithmetic, with one rule changed, names an optimizer mistake: no bias correction, weight
// decay on every tensor, clipping applied to the update instead of to the gradients before the moments,
// or the learning rate of the step before or after.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "model/param_table.h"
#include "optim/optimizer.h"

namespace touchstone::diff {

// One way of applying AdamW: Touchstone's (docs/contract.md) when `signature` is empty, or a mistake.
struct OptimizerRule {
  std::string signature, message;
  bool bias_correction = true;
  bool decay_every_tensor = false;  // weight decay on the 1-D norm weights too
  bool clip_the_update = false;     // moments of the unclipped gradients, the clip coefficient on the update
  int64_t lr_offset = 0;            // update s uses the learning rate of update s + lr_offset
};

std::vector<OptimizerRule> mistaken_optimizer_rules();

// The format the master weights and the optimizer's arithmetic are stored in.
struct MasterFormat {
  double unit_roundoff = 0x1p-53;  // u: 2^-53 (FP64) or 2^-24 (FP32)
  int digits = 53;                 // significand bits: 53 or 24
};
// fp64 -> FP64; fp32 and bf16 (FP32 master weights) -> FP32.
MasterFormat master_format(Precision precision);

// What AdamW consumes to produce the parameters after update s.
struct OptimizerInputs {
  std::vector<const ParamTensors*> grads;  // gradients before clipping of the updates replayed, in order
  // The gradient norm the candidate recorded for each replayed update (its clip coefficient follows from
  // it); NaN where it recorded none, and the FP64 norm of its gradients is used.
  std::vector<double> norms;
  const AdamWState* moments = nullptr;   // moments before the first replayed update (null: zeros, update 1)
  const ParamTensors* before = nullptr;  // the parameters after update s-1
};

struct ExpectedUpdate {
  ParamTensors params;  // after update s
  ParamTensors bounds;  // per element: |candidate - params| the rounding of the update formula allows
  double lr = 0.0;      // the rate update s used
};

// Update s = (moments ? moments->step : 0) + grads.size(), computed in FP64 under `rule`. The bound of
// element i (derived in docs/precision.md "The optimizer check"):
//   3 ulp(max(|p_i|, |p'_i|)) + lr u [(12 + 6 n + kappa_s + c) A_i + 2 wd |p_i|]
// u the master format's unit roundoff, n the number of replayed updates, A_i the update's size with
// |g| in the first moment, kappa_s = b1/(1-b1) + b2/(2(1-b2)) + b1^s/(1-b1^s) + b2^s/(2(1-b2^s)) (the
// constants rounded to the master format), c = sqrt(N) + 2 when a replayed update was clipped with a
// norm the candidate did not record (the FP32 norm of N elements), else 2.
ExpectedUpdate expected_update(const ParamTable& table, const OptimConfig& optim,
                               const OptimizerInputs& inputs, const OptimizerRule& rule, MasterFormat format);

// The largest |m_hat / sqrt(v_hat)| AdamW can produce at update t, whatever the gradients (Cauchy-
// Schwarz on the moment sums): an update moves an element by at most lr x this (plus weight decay).
double adam_step_bound(const OptimConfig& optim, int64_t t);

// The global L2 norm of full gradients, every table tensor once (a tied embedding once).
double global_norm(const ParamTensors& grads);

}  // namespace touchstone::diff
