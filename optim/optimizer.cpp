// Learning-rate schedule, gradient norm and clipping, and the AdamW driver.
#include "optim/optimizer.h"

#include <cmath>
#include <numbers>

namespace touchstone {

double learning_rate(const OptimConfig& o, int64_t update) {
  if (update <= o.warmup_steps) {
    return o.lr * static_cast<double>(update) / static_cast<double>(o.warmup_steps);
  }
  if (update > o.decay_steps) return o.min_lr;
  const double progress =
      static_cast<double>(update - o.warmup_steps) / static_cast<double>(o.decay_steps - o.warmup_steps);
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
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

void adamw_step(Backend& backend, const ParamTable& table, const OptimConfig& o, double lr, double grad_scale,
                const ParamTensors& grads, ParamTensors& params, AdamWState& state) {
  state.step += 1;
  for (int id = 0; id < table.size(); ++id) {
    if (params[id].empty()) continue;  // a tensor this rank does not hold
    std::vector<double> scaled = grads[id];
    for (double& g : scaled) g *= grad_scale;
    const AdamWStep step{lr, o.beta1, o.beta2, o.eps, table[id].weight_decay ? o.weight_decay : 0.0, state.step};
    backend.adamw_update(params[id].data(), scaled.data(), state.exp_avg[id].data(), state.exp_avg_sq[id].data(),
                         static_cast<int64_t>(scaled.size()), step);
  }
}

}  // namespace touchstone
