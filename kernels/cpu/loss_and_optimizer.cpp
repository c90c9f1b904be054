// CPU cross entropy (forward and backward) and the AdamW update. Both compute in T: double in FP64
// mode, float otherwise (cross entropy upcasts BF16 logits to FP32; AdamW keeps FP32 state). Cross
// entropy runs parallel over rows (each row's max and sum in one thread, in vocabulary order), AdamW over
// elements (parallel_for.h).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/exp_fp64.h"
#include "kernels/cpu/parallel_for.h"
#include "kernels/cpu/row_reductions.h"

namespace touchstone {

namespace {

constexpr int32_t kIgnoreIndex = -100;
// Logits per exponential call in the forward's sum (a buffer on the stack).
constexpr int64_t kExpChunk = 256;

template <typename T>
void row_max_impl(const double* logits, int64_t rows, int64_t vocab_local, double* row_max) {
  cpu::parallel_for(rows, vocab_local, [&](int64_t n) {
    row_max[n] = static_cast<double>(cpu::row_max<T>(logits + n * vocab_local, vocab_local));
  });
}

template <typename T>
void partials_impl(const double* logits, const int32_t* targets, int64_t rows, int64_t vocab_local,
                   int64_t vocab_start, const double* row_max, double* sum_exp, double* target_logit) {
  cpu::parallel_for(rows, vocab_local, [&](int64_t n) {
    const double* row = logits + n * vocab_local;
    const auto max = static_cast<T>(row_max[n]);
    T sum = 0;
    // exp(row - max) of the chunk [first, first + count), then added to the sum (statistic_sum)
    double chunk[kExpChunk];
    for (int64_t first = 0; first < vocab_local; first += kExpChunk) {
      const int64_t count = std::min(kExpChunk, vocab_local - first);
      cpu::exp_rows<T>(row + first, 1, count, &max, chunk);
      sum = cpu::statistic_sum<T>(
          count, [&chunk](int64_t c) { return static_cast<T>(chunk[c]); }, sum);
    }
    sum_exp[n] = static_cast<double>(sum);
    const int64_t local = static_cast<int64_t>(targets[n]) - vocab_start;
    target_logit[n] = targets[n] != kIgnoreIndex && local >= 0 && local < vocab_local ? row[local] : 0.0;
  });
}

template <typename T>
void loss_impl(const double* row_max, const double* sum_exp, const double* target_logit,
               const int32_t* targets, int64_t rows, double* losses) {
  cpu::parallel_for(rows, 1, [&](int64_t n) {
    losses[n] = targets[n] == kIgnoreIndex
                    ? 0.0
                    : static_cast<double>(std::log(static_cast<T>(sum_exp[n])) + static_cast<T>(row_max[n]) -
                                          static_cast<T>(target_logit[n]));
  });
}

template <typename T, typename R>
void ce_backward_impl(const double* logits, const int32_t* targets, int64_t rows, int64_t vocab_local,
                      int64_t vocab_start, const double* row_max, const double* sum_exp, double loss_weight,
                      double* dlogits, const R& r) {
  cpu::parallel_for(rows, vocab_local, [&](int64_t n) {
    const double* row = logits + n * vocab_local;
    double* drow = dlogits + n * vocab_local;
    if (targets[n] == kIgnoreIndex) {
      for (int64_t i = 0; i < vocab_local; ++i) drow[i] = 0.0;
      return;
    }
    const auto w = static_cast<T>(loss_weight), m = static_cast<T>(row_max[n]),
               z = static_cast<T>(sum_exp[n]);
    const int64_t local = static_cast<int64_t>(targets[n]) - vocab_start;
    cpu::exp_rows<T>(row, 1, vocab_local, &m, drow);  // exp(row - m)
    for (int64_t i = 0; i < vocab_local; ++i) {
      // Megatron-LM's order: softmax - onehot in T, times the incoming gradient w in T, one rounding to
      // the activation format. With global_token_mean w is 1 and the 1/num_loss_tokens scale is applied
      // to the main gradients afterwards (loss_scaling in oracle/train_step.h).
      T d = static_cast<T>(drow[i]) / z;
      if (i == local) d -= T(1);
      drow[i] = r.activation(static_cast<double>(d * w));
    }
  });
}

template <typename T>
void adamw_impl(double* param, const double* grad, double* exp_avg, double* exp_avg_sq, int64_t n,
                const AdamWStep& s) {
  const auto b1 = static_cast<T>(s.beta1), b2 = static_cast<T>(s.beta2), lr = static_cast<T>(s.lr);
  const auto eps = static_cast<T>(s.eps), wd = static_cast<T>(s.weight_decay);
  const auto step = static_cast<double>(s.step);
  const auto bias_correction1 = static_cast<T>(1.0 - std::pow(s.beta1, step));
  const auto bias_correction2 = static_cast<T>(1.0 - std::pow(s.beta2, step));
  const double grad_scale = s.grad_scale;
  cpu::parallel_for(n, 1, [&](int64_t i) {
    const auto g = static_cast<T>(grad[i] * grad_scale);
    const T m = b1 * static_cast<T>(exp_avg[i]) + (T(1) - b1) * g;
    const T v = b2 * static_cast<T>(exp_avg_sq[i]) + (T(1) - b2) * g * g;
    T p = static_cast<T>(param[i]) * (T(1) - lr * wd);
    p -= lr * (m / bias_correction1) / (std::sqrt(v / bias_correction2) + eps);
    exp_avg[i] = static_cast<double>(m);
    exp_avg_sq[i] = static_cast<double>(v);
    param[i] = static_cast<double>(p);
  });
}

}  // namespace

void CpuBackend::logits_row_max(const double* logits, int64_t rows, int64_t vocab_local, double* row_max) {
  if (precision() == Precision::kFp64) {
    row_max_impl<double>(logits, rows, vocab_local, row_max);
  } else {
    row_max_impl<float>(logits, rows, vocab_local, row_max);
  }
}

void CpuBackend::cross_entropy_partials(const double* logits, const int32_t* targets, int64_t rows,
                                        int64_t vocab_local, int64_t vocab_start, const double* row_max,
                                        double* sum_exp, double* target_logit) {
  if (precision() == Precision::kFp64) {
    partials_impl<double>(logits, targets, rows, vocab_local, vocab_start, row_max, sum_exp, target_logit);
  } else {
    partials_impl<float>(logits, targets, rows, vocab_local, vocab_start, row_max, sum_exp, target_logit);
  }
}

void CpuBackend::cross_entropy_loss(const double* row_max, const double* sum_exp, const double* target_logit,
                                    const int32_t* targets, int64_t rows, double* losses) {
  if (precision() == Precision::kFp64) {
    loss_impl<double>(row_max, sum_exp, target_logit, targets, rows, losses);
  } else {
    loss_impl<float>(row_max, sum_exp, target_logit, targets, rows, losses);
  }
}

void CpuBackend::cross_entropy_backward(const double* logits, const int32_t* targets, int64_t rows,
                                        int64_t vocab_local, int64_t vocab_start, const double* row_max,
                                        const double* sum_exp, double loss_weight, double* dlogits) {
  if (precision() == Precision::kFp64) {
    ce_backward_impl<double>(logits, targets, rows, vocab_local, vocab_start, row_max, sum_exp, loss_weight,
                             dlogits, cpu::NoRounding{});
  } else {
    ce_backward_impl<float>(logits, targets, rows, vocab_local, vocab_start, row_max, sum_exp, loss_weight,
                            dlogits, rounding_);
  }
}

void CpuBackend::adamw_update(double* param, const double* grad, double* exp_avg, double* exp_avg_sq,
                              int64_t n, const AdamWStep& s) {
  if (precision() == Precision::kFp64) {
    adamw_impl<double>(param, grad, exp_avg, exp_avg_sq, n, s);
  } else {
    adamw_impl<float>(param, grad, exp_avg, exp_avg_sq, n, s);
  }
}

}  // namespace touchstone
