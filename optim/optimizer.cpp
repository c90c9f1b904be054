// Learning-rate schedule, gradient norm and clipping, and the AdamW driver.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace touchstone {

namespace {

// Update s at the schedule's point s: warm-up to lr over updates 1..W, cosine to min_lr at D.
double touchstone_rate(const OptimConfig& o, int64_t update) {
  if (update <= o.warmup_steps) {
    if (o.warmup_steps == 0) return o.lr;  // update 0 without warm-up: the cosine's start
    return o.warmup_init +
           (o.lr - o.warmup_init) * static_cast<double>(update) / static_cast<double>(o.warmup_steps);
  }
  if (update > o.decay_steps) return o.min_lr;
  const double progress =
      static_cast<double>(update - o.warmup_steps) / static_cast<double>(o.decay_steps - o.warmup_steps);
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

// Megatron-LM's OptimizerParamScheduler.get_lr (megatron/core/optimizer_param_scheduler.py, decay
// style cosine) at num_steps = n: the scheduler is stepped once (by the global batch) after each
// optimizer.step(), so update s runs at n = s - 1. Megatron counts samples (n, W and D times the
// global batch); every ratio below is the same, and the operations are Megatron's, in its order.
double megatron_rate(const OptimConfig& o, int64_t update) {
  const int64_t n = update - 1;
  if (n < 0) return 0.0;  // no scheduler state before the first update
  const auto steps = static_cast<double>(n);
  if (o.warmup_steps > 0 && n <= o.warmup_steps) {
    return o.warmup_init + (o.lr - o.warmup_init) * steps / static_cast<double>(o.warmup_steps);
  }
  if (n > o.decay_steps) return o.min_lr;
  const double decay_ratio =
      static_cast<double>(n - o.warmup_steps) / static_cast<double>(o.decay_steps - o.warmup_steps);
  const double coeff = 0.5 * (std::cos(std::numbers::pi * decay_ratio) + 1.0);
  return o.min_lr + coeff * (o.lr - o.min_lr);
}

}  // namespace

double learning_rate(const OptimConfig& o, int64_t update) {
  switch (o.schedule_convention) {
    case ScheduleConvention::kMegatron:
      return megatron_rate(o, update);
    case ScheduleConvention::kTouchstone:
      break;
  }
  return touchstone_rate(o, update);
}

double clip_coefficient(double grad_norm, double clip_grad) {
  if (clip_grad <= 0.0) return 1.0;
  return std::min(1.0, clip_grad / (grad_norm + 1e-6));
}

AdamWState AdamWState::zeros_like(const ParamTensors& params) {
  AdamWState state;
  for (const auto& tensor : params.tensors) state.exp_avg.tensors.emplace_back(tensor.size(), 0.0);
  state.exp_avg_sq = state.exp_avg;
  return state;
}

void adamw_update_in_pieces(Backend& backend, const AdamWStep& step, const double* grad, double* param,
                            double* exp_avg, double* exp_avg_sq, int64_t n) {
  if (exp_avg != nullptr) {  // kept moments: one call, nothing beside the model state
    backend.adamw_update(param, grad, exp_avg, exp_avg_sq, n, step);
    return;
  }
  const int64_t piece = std::min(n, kAdamWPiece);
  std::vector<double> m(static_cast<size_t>(piece)), v(m.size());
  for (int64_t lo = 0; lo < n; lo += piece) {
    const int64_t len = std::min(piece, n - lo);
    std::fill(m.begin(), m.end(), 0.0);
    std::fill(v.begin(), v.end(), 0.0);
    backend.adamw_update(param + lo, grad + lo, m.data(), v.data(), len, step);
  }
}

void adamw_step(Backend& backend, const ParamTable& table, const OptimConfig& o, double lr, double grad_scale,
                const ParamTensors& grads, ParamTensors& params, AdamWState& state) {
  state.step += 1;
  const bool kept = !state.exp_avg.tensors.empty();
  for (int id = 0; id < table.size(); ++id) {
    if (params[id].empty()) continue;  // a tensor this rank does not hold
    const AdamWStep step{lr,         o.beta1,   o.beta2, o.eps, table[id].weight_decay ? o.weight_decay : 0.0,
                         state.step, grad_scale};
    adamw_update_in_pieces(
        backend, step, grads[id].data(), params[id].data(), kept ? state.exp_avg[id].data() : nullptr,
        kept ? state.exp_avg_sq[id].data() : nullptr, static_cast<int64_t>(params[id].size()));
  }
}

}  // namespace touchstone
