// The optimizer side of a step (docs/contract.md, "Update"): learning-rate schedule, global
// gradient norm, clipping, and AdamW over every tensor of the parameter table.
#pragma once

#include <cstdint>

#include "common/config.h"
#include "kernels/backend.h"
#include "model/param_table.h"

namespace touchstone {

// LR for update s (1-based): lr * s / W while s <= W, then cosine from lr to min_lr over updates
// W..decay_steps, min_lr after decay_steps.
double learning_rate(const OptimConfig& optim, int64_t update);

// The factor all gradients are scaled by before the update: min(1, clip / (norm + 1e-6)); 1 when
// clipping is off (clip_grad == 0).
double clip_coefficient(double grad_norm, double clip_grad);

struct AdamWState {
  ParamTensors exp_avg;     // first moments, same shapes as the parameters
  ParamTensors exp_avg_sq;  // second moments
  int64_t step = 0;         // updates applied so far

  static AdamWState zeros_like(const ParamTensors& params);  // empty tensors stay empty
};

// One AdamW update of every (non-empty) tensor with gradients scaled by `grad_scale` (the clip
// coefficient). Weight decay applies to the tensors the table marks (2 or more dimensions).
void adamw_step(Backend& backend, const ParamTable& table, const OptimConfig& optim, double lr,
                double grad_scale, const ParamTensors& grads, ParamTensors& params, AdamWState& state);

}  // namespace touchstone
