// CPU cross entropy (forward and backward) and the AdamW update.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace touchstone {

namespace {
constexpr int32_t kIgnoreIndex = -100;
}  // namespace

void CpuBackend::logits_row_max(const double* logits, int64_t rows, int64_t vocab_local, double* row_max) {
  for (int64_t n = 0; n < rows; ++n) {
    const double* row = logits + n * vocab_local;
    double m = row[0];
    for (int64_t i = 1; i < vocab_local; ++i) m = std::max(m, row[i]);
    row_max[n] = m;
  }
}

void CpuBackend::cross_entropy_partials(const double* logits, const int32_t* targets, int64_t rows,
                                        int64_t vocab_local, int64_t vocab_start, const double* row_max,
                                        double* sum_exp, double* target_logit) {
  for (int64_t n = 0; n < rows; ++n) {
    const double* row = logits + n * vocab_local;
    double sum = 0.0;
    for (int64_t i = 0; i < vocab_local; ++i) sum += std::exp(row[i] - row_max[n]);
    sum_exp[n] = sum;
    const int64_t local = static_cast<int64_t>(targets[n]) - vocab_start;
    target_logit[n] = targets[n] != kIgnoreIndex && local >= 0 && local < vocab_local ? row[local] : 0.0;
  }
}

void CpuBackend::cross_entropy_loss(const double* row_max, const double* sum_exp, const double* target_logit,
                                    const int32_t* targets, int64_t rows, double* losses) {
  for (int64_t n = 0; n < rows; ++n) {
    losses[n] = targets[n] == kIgnoreIndex ? 0.0 : std::log(sum_exp[n]) + row_max[n] - target_logit[n];
  }
}

void CpuBackend::cross_entropy_backward(const double* logits, const int32_t* targets, int64_t rows,
                                        int64_t vocab_local, int64_t vocab_start, const double* row_max,
                                        const double* sum_exp, double loss_weight, double* dlogits) {
  for (int64_t n = 0; n < rows; ++n) {
    const double* row = logits + n * vocab_local;
    double* drow = dlogits + n * vocab_local;
    if (targets[n] == kIgnoreIndex) {
      for (int64_t i = 0; i < vocab_local; ++i) drow[i] = 0.0;
      continue;
    }
    for (int64_t i = 0; i < vocab_local; ++i) drow[i] = loss_weight * std::exp(row[i] - row_max[n]) / sum_exp[n];
    const int64_t local = static_cast<int64_t>(targets[n]) - vocab_start;
    if (local >= 0 && local < vocab_local) drow[local] -= loss_weight;
  }
}

void CpuBackend::adamw_update(double* param, const double* grad, double* exp_avg, double* exp_avg_sq, int64_t n,
                              const AdamWStep& s) {
  const double step = static_cast<double>(s.step);
  const double bias_correction1 = 1.0 - std::pow(s.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(s.beta2, step);
  for (int64_t i = 0; i < n; ++i) {
    exp_avg[i] = s.beta1 * exp_avg[i] + (1.0 - s.beta1) * grad[i];
    exp_avg_sq[i] = s.beta2 * exp_avg_sq[i] + (1.0 - s.beta2) * grad[i] * grad[i];
    param[i] *= 1.0 - s.lr * s.weight_decay;
    param[i] -= s.lr * (exp_avg[i] / bias_correction1) / (std::sqrt(exp_avg_sq[i] / bias_correction2) + s.eps);
  }
}

}  // namespace touchstone
