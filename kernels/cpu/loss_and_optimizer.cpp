// CPU cross entropy (forward and backward) and the AdamW update.
#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace touchstone {

namespace {

constexpr int32_t kIgnoreIndex = -100;

double log_sum_exp(const double* row, int64_t n) {
  double row_max = row[0];
  for (int64_t i = 1; i < n; ++i) row_max = std::max(row_max, row[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(row[i] - row_max);
  return row_max + std::log(sum);
}

}  // namespace

void CpuBackend::cross_entropy_forward(const double* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                                       double* losses) {
  for (int64_t n = 0; n < rows; ++n) {
    const double* row = logits + n * vocab;
    losses[n] = targets[n] == kIgnoreIndex ? 0.0 : log_sum_exp(row, vocab) - row[targets[n]];
  }
}

void CpuBackend::cross_entropy_backward(const double* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                                        double loss_weight, double* dlogits) {
  for (int64_t n = 0; n < rows; ++n) {
    const double* row = logits + n * vocab;
    double* drow = dlogits + n * vocab;
    if (targets[n] == kIgnoreIndex) {
      for (int64_t i = 0; i < vocab; ++i) drow[i] = 0.0;
      continue;
    }
    const double lse = log_sum_exp(row, vocab);
    for (int64_t i = 0; i < vocab; ++i) drow[i] = loss_weight * std::exp(row[i] - lse);
    drow[targets[n]] -= loss_weight;
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
