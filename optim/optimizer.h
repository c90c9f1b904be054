// The optimizer side of a step (docs/contract.md, "Update"): learning-rate schedule, global
// gradient norm, clipping, and AdamW over every tensor of the parameter table.
#pragma once

#include <cstdint>

#include "common/config.h"
#include "kernels/backend.h"
#include "model/param_table.h"

namespace touchstone {

// LR for update s (1-based), W = warmup_steps, D = decay_steps, i = warmup_init:
//   touchstone  the schedule at s: i + (lr - i) s / W while s <= W, then cosine from lr to min_lr over
//               updates W..D, min_lr after D (docs/contract.md);
//   megatron    the schedule at s - 1 (Megatron-LM's scheduler, stepped after each update): update 1
//               runs at i (0 by default, so its parameters do not move), update W + 1 at lr.
// Update 0 is the rate one step before update 1, for the optimizer check's "one step behind" rule:
// i with warm-up (lr without) under touchstone, 0 under megatron.
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

// AdamW without kept moments runs on pieces of at most this many elements, so that the moments it forms
// in scratch are 2 x 8 MiB whatever the tensor's size.
inline constexpr int64_t kAdamWPiece = int64_t{1} << 20;

// AdamW on n elements, reading each gradient as grad[i] * step.grad_scale (the clip coefficient; `grad`
// itself, an output, stays as it is). With `exp_avg` and `exp_avg_sq` null the moments start at zero
// and are not kept: each piece's are formed in zeroed scratch and dropped (the last update of a run that
// saves no optimizer state; docs/planning.md). Elementwise, so the pieces change no bit.
void adamw_update_in_pieces(Backend& backend, const AdamWStep& step, const double* grad, double* param,
                            double* exp_avg, double* exp_avg_sq, int64_t n);

// One AdamW update of every (non-empty) tensor with gradients scaled by `grad_scale` (the clip
// coefficient). Weight decay applies to the tensors the table marks (2 or more dimensions). A `state`
// without tensors (moments at zero, not kept) stays without them; its step still counts.
void adamw_step(Backend& backend, const ParamTable& table, const OptimConfig& optim, double lr,
                double grad_scale, const ParamTensors& grads, ParamTensors& params, AdamWState& state);

}  // namespace touchstone
