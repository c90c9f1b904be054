// The optimizer check's arithmetic: AdamW replayed in FP64 with per-element rounding bounds.
#include "oracle/diff/optimizer_check.h"

#include <cmath>

namespace touchstone::diff {

std::vector<OptimizerRule> mistaken_optimizer_rules() {
  //       signature                    message                                          bias   decay  clip lr
  return {
      {"optimizer_bias_correction",
       "optimizer without bias correction: the updated parameters match AdamW with m and v not divided by "
       "(1 - beta^t), applied to the candidate's own gradients",
       false, false, false, 0},
      {"optimizer_weight_decay",
       "weight decay on every tensor: the updated parameters match AdamW that also decays the 1-D norm "
       "weights (the contract decays 2-D tensors only)",
       true, true, false, 0},
      {"optimizer_clipping",
       "clipping after the moments: the updated parameters match AdamW whose moments hold the unclipped "
       "gradients and whose update is scaled by the clip coefficient (clip the gradients before the "
       "optimizer step)",
       true, false, true, 0},
      {"learning_rate_behind",
       "learning rate one step behind: update s used the rate of update s-1, so update 1 ran at the "
       "warm-up's start (0: its parameters did not move); Megatron-LM's scheduler does this against "
       "optim.schedule_convention = touchstone: make the golden file with optim.schedule_convention = "
       "megatron (docs/frameworks/megatron.md)",
       true, false, false, -1},
      {"learning_rate_ahead",
       "learning rate one step ahead: update s used the rate of update s+1; a scheduler stepped before "
       "the optimizer (PyTorch's LambdaLR called first, or Touchstone's own convention) does this "
       "against optim.schedule_convention = megatron",
       true, false, false, 1}};
}

MasterFormat master_format(Precision precision) {
  return precision == Precision::kFp64 ? MasterFormat{0x1p-53, 53} : MasterFormat{0x1p-24, 24};
}

double global_norm(const ParamTensors& grads) {
  double sum = 0.0;
  for (const auto& tensor : grads.tensors) {
    for (double g : tensor) sum += g * g;
  }
  return std::sqrt(sum);
}

double adam_step_bound(const OptimConfig& o, int64_t t) {
  // |sum_k b1^(t-k) g_k| <= sqrt(sum_j (b1^2/b2)^j) sqrt(sum_k b2^(t-k) g_k^2), j = 0..t-1.
  double geometric = 0.0, term = 1.0;
  for (int64_t j = 0; j < t; ++j, term *= o.beta1 * o.beta1 / o.beta2) geometric += term;
  const auto steps = static_cast<double>(t);
  return (1 - o.beta1) / (1 - std::pow(o.beta1, steps)) *
         std::sqrt((1 - std::pow(o.beta2, steps)) / (1 - o.beta2)) * std::sqrt(geometric);
}

namespace {

double ulp(double x, int digits) {
  return x > 0 && std::isfinite(x) ? std::ldexp(1.0, std::ilogb(x) - (digits - 1)) : 0.0;
}

}  // namespace

ExpectedUpdate expected_update(const ParamTable& table, const OptimConfig& o, const OptimizerInputs& in,
                               const OptimizerRule& rule, MasterFormat format) {
  const ParamTensors& before = *in.before;
  AdamWState moments = in.moments ? *in.moments : AdamWState::zeros_like(before);
  // The first moment of |g|: the scale the moments' rounding errors are relative to.
  ParamTensors abs_moment = moments.exp_avg;
  for (auto& t : abs_moment.tensors) {
    for (double& x : t) x = std::fabs(x);
  }
  int64_t numel = 0;
  for (const auto& t : before.tensors) numel += static_cast<int64_t>(t.size());
  bool clipped_by_own_norm = false;
  double last_clip = 1.0;
  for (size_t k = 0; k < in.grads.size(); ++k) {
    const ParamTensors* grads = in.grads[k];
    moments.step += 1;
    const bool recorded = k < in.norms.size() && std::isfinite(in.norms[k]);
    last_clip = clip_coefficient(recorded ? in.norms[k] : global_norm(*grads), o.clip_grad);
    clipped_by_own_norm = clipped_by_own_norm || (last_clip < 1.0 && !recorded);
    const double scale = rule.clip_the_update ? 1.0 : last_clip;
    for (int id = 0; id < table.size(); ++id) {
      const std::vector<double>& g = (*grads)[id];
      std::vector<double>&m = moments.exp_avg[id], &v = moments.exp_avg_sq[id], &a = abs_moment[id];
      for (size_t i = 0; i < g.size(); ++i) {
        const double x = g[i] * scale;
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * x;
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * x * x;
        a[i] = o.beta1 * a[i] + (1 - o.beta1) * std::fabs(x);
      }
    }
  }
  const int64_t s = moments.step;
  const int64_t lr_update = s + rule.lr_offset;
  ExpectedUpdate out;
  out.lr = learning_rate(o, lr_update);
  const auto t = static_cast<double>(s);
  const double bc1 = rule.bias_correction ? 1 - std::pow(o.beta1, t) : 1.0;
  const double bc2 = rule.bias_correction ? 1 - std::pow(o.beta2, t) : 1.0;
  const double u = format.unit_roundoff;
  // The FP32 (or FP64) constants 1 - b1, 1 - b2 and the bias corrections, rounded where an
  // implementation chooses: relative errors u b/(1-b), halved under the square root for b2.
  const double kappa = o.beta1 / (1 - o.beta1) + o.beta2 / (2 * (1 - o.beta2)) +
                       std::pow(o.beta1, t) / (1 - std::pow(o.beta1, t)) +
                       std::pow(o.beta2, t) / (2 * (1 - std::pow(o.beta2, t)));
  // 10: the update formula's roundings; 6 per replayed update: the moments'; 2: the gradient as recorded
  // may be an FP64 sum of parts the candidate added in the master format; the clip coefficient's.
  const double arithmetic = 12.0 + 6.0 * static_cast<double>(in.grads.size()) + kappa +
                            (clipped_by_own_norm ? std::sqrt(static_cast<double>(numel)) + 2.0 : 2.0);
  out.params = before;
  out.bounds = before;
  for (int id = 0; id < table.size(); ++id) {
    const double wd = table[id].weight_decay || rule.decay_every_tensor ? o.weight_decay : 0.0;
    std::vector<double>&p = out.params[id], &b = out.bounds[id];
    for (size_t i = 0; i < p.size(); ++i) {
      // In the order of the FP64 AdamW of kernels/cpu/loss_and_optimizer.cpp, so that Touchstone's own
      // FP64 run is reproduced bit for bit.
      const double denominator = std::sqrt(moments.exp_avg_sq[id][i] / bc2) + o.eps;
      const double first = rule.clip_the_update ? moments.exp_avg[id][i] * last_clip : moments.exp_avg[id][i];
      const double size = abs_moment[id][i] / bc1 / denominator;
      const double old = p[i];
      p[i] = old * (1 - out.lr * wd);
      p[i] -= out.lr * (first / bc1) / denominator;
      b[i] = 3 * ulp(std::max(std::fabs(old), std::fabs(p[i])), format.digits) +
             out.lr * u * (arithmetic * size + 2 * wd * std::fabs(old));
    }
  }
  return out;
}

}  // namespace touchstone::diff
