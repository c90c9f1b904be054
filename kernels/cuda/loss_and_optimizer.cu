// CUDA vocab-parallel cross entropy (forward and backward) and the AdamW update, the device twin of
// kernels/cpu/loss_and_optimizer.cpp. T is double in FP64 mode and float otherwise.
#include <cmath>

#include "kernels/cuda/cuda_backend.cuh"

namespace touchstone {

namespace {

constexpr int32_t kIgnoreIndex = -100;

// One block per row: row_max[N] over logits[N, Vl] (exact: a max does not depend on the order).
template <typename T>
__global__ void row_max_kernel(const double* logits, int64_t vocab_local, double* row_max) {
  const int64_t n = blockIdx.x;
  const double* row = logits + n * vocab_local;
  T m = static_cast<T>(row[0]);
  for (int64_t i = threadIdx.x; i < vocab_local; i += blockDim.x) m = max(m, static_cast<T>(row[i]));
  m = cuda::block_max(m);
  if (threadIdx.x == 0) row_max[n] = static_cast<double>(m);
}

// One block per row: sum_exp[n] = sum_i exp(logit - row_max) in the fixed block order; target_logit[n]
// is the target's logit when it is in this rank's slice (exact, no arithmetic).
template <typename T>
__global__ void partials_kernel(const double* logits, const int32_t* targets, int64_t vocab_local,
                                int64_t vocab_start, const double* row_max, double* sum_exp,
                                double* target_logit) {
  const int64_t n = blockIdx.x;
  const double* row = logits + n * vocab_local;
  const auto m = static_cast<T>(row_max[n]);
  T partial = 0;
  for (int64_t i = threadIdx.x; i < vocab_local; i += blockDim.x) partial += exp(static_cast<T>(row[i]) - m);
  const T sum = cuda::block_sum(partial);
  if (threadIdx.x == 0) {
    sum_exp[n] = static_cast<double>(sum);
    const int64_t local = static_cast<int64_t>(targets[n]) - vocab_start;
    target_logit[n] = targets[n] != kIgnoreIndex && local >= 0 && local < vocab_local ? row[local] : 0.0;
  }
}

template <typename T>
__global__ void loss_kernel(const double* row_max, const double* sum_exp, const double* target_logit,
                            const int32_t* targets, int64_t rows, double* losses) {
  TOUCHSTONE_GRID_STRIDE_LOOP(n, rows) {
    losses[n] = targets[n] == kIgnoreIndex
                    ? 0.0
                    : static_cast<double>(log(static_cast<T>(sum_exp[n])) + static_cast<T>(row_max[n]) -
                                          static_cast<T>(target_logit[n]));
  }
}

// dlogits[N, Vl] = w * (softmax - onehot(target)), 0 on ignored rows.
template <typename T>
__global__ void ce_backward_kernel(const double* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab_local, int64_t vocab_start, const double* row_max,
                                   const double* sum_exp, double loss_weight, cpu::Rounding r,
                                   double* dlogits) {
  TOUCHSTONE_GRID_STRIDE_LOOP(e, rows * vocab_local) {
    const int64_t n = e / vocab_local, i = e % vocab_local;
    if (targets[n] == kIgnoreIndex) {
      dlogits[e] = 0.0;
      continue;
    }
    const auto w = static_cast<T>(loss_weight), m = static_cast<T>(row_max[n]),
               z = static_cast<T>(sum_exp[n]);
    T d = exp(static_cast<T>(logits[e]) - m) / z;  // the CPU reference's order: (p - onehot) * w
    if (i == static_cast<int64_t>(targets[n]) - vocab_start) d -= T(1);
    dlogits[e] = r.activation(static_cast<double>(d * w));
  }
}

// PyTorch's AdamW with bias correction; the corrections are computed on the host in double, as the CPU
// reference does, then used in T.
template <typename T>
__global__ void adamw_kernel(double* param, const double* grad, double* exp_avg, double* exp_avg_sq,
                             int64_t n, double lr, double beta1, double beta2, double eps,
                             double weight_decay, double bias_correction1, double bias_correction2,
                             double grad_scale) {
  const auto b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2), step_lr = static_cast<T>(lr);
  const auto e = static_cast<T>(eps), wd = static_cast<T>(weight_decay);
  const auto c1 = static_cast<T>(bias_correction1), c2 = static_cast<T>(bias_correction2);
  TOUCHSTONE_GRID_STRIDE_LOOP(i, n) {
    const auto g = static_cast<T>(grad[i] * grad_scale);
    const T m = b1 * static_cast<T>(exp_avg[i]) + (T(1) - b1) * g;
    const T v = b2 * static_cast<T>(exp_avg_sq[i]) + (T(1) - b2) * g * g;
    T p = static_cast<T>(param[i]) * (T(1) - step_lr * wd);
    p -= step_lr * (m / c1) / (sqrt(v / c2) + e);
    exp_avg[i] = static_cast<double>(m);
    exp_avg_sq[i] = static_cast<double>(v);
    param[i] = static_cast<double>(p);
  }
}

}  // namespace

void CudaBackend::logits_row_max(const double* logits, int64_t rows, int64_t vocab_local, double* row_max) {
  if (rows == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_logits = s.upload(logits, rows * vocab_local);  // [N, Vl]
  double* d_max = s.output<double>(rows);                         // [N]
  const cuda::Launch launch = cuda::per_row(rows);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(row_max_kernel<decltype(compute)>, launch, stream_, d_logits, vocab_local, d_max);
  });
  cuda::check_launch("logits_row_max");
  s.download(row_max, d_max, rows);
  s.finish();
}

void CudaBackend::cross_entropy_partials(const double* logits, const int32_t* targets, int64_t rows,
                                         int64_t vocab_local, int64_t vocab_start, const double* row_max,
                                         double* sum_exp, double* target_logit) {
  if (rows == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_logits = s.upload(logits, rows * vocab_local);  // [N, Vl]
  const int32_t* d_targets = s.upload(targets, rows);             // [N]
  const double* d_max = s.upload(row_max, rows);                  // [N]
  double* d_sum = s.output<double>(rows);                         // [N]
  double* d_target = s.output<double>(rows);                      // [N]
  const cuda::Launch launch = cuda::per_row(rows);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(partials_kernel<decltype(compute)>, launch, stream_, d_logits, d_targets, vocab_local,
                        vocab_start, d_max, d_sum, d_target);
  });
  cuda::check_launch("cross_entropy_partials");
  s.download(sum_exp, d_sum, rows);
  s.download(target_logit, d_target, rows);
  s.finish();
}

void CudaBackend::cross_entropy_loss(const double* row_max, const double* sum_exp, const double* target_logit,
                                     const int32_t* targets, int64_t rows, double* losses) {
  if (rows == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_max = s.upload(row_max, rows);
  const double* d_sum = s.upload(sum_exp, rows);
  const double* d_target = s.upload(target_logit, rows);
  const int32_t* d_targets = s.upload(targets, rows);
  double* d_losses = s.output<double>(rows);
  const cuda::Launch launch = cuda::per_element(rows);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(loss_kernel<decltype(compute)>, launch, stream_, d_max, d_sum, d_target, d_targets,
                        rows, d_losses);
  });
  cuda::check_launch("cross_entropy_loss");
  s.download(losses, d_losses, rows);
  s.finish();
}

void CudaBackend::cross_entropy_backward(const double* logits, const int32_t* targets, int64_t rows,
                                         int64_t vocab_local, int64_t vocab_start, const double* row_max,
                                         const double* sum_exp, double loss_weight, double* dlogits) {
  if (rows * vocab_local == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_logits = s.upload(logits, rows * vocab_local);  // [N, Vl]
  const int32_t* d_targets = s.upload(targets, rows);
  const double* d_max = s.upload(row_max, rows);
  const double* d_sum = s.upload(sum_exp, rows);
  double* d_dlogits = s.output<double>(rows * vocab_local);  // [N, Vl]
  const cuda::Launch launch = cuda::per_element(rows * vocab_local);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(ce_backward_kernel<decltype(compute)>, launch, stream_, d_logits, d_targets, rows,
                        vocab_local, vocab_start, d_max, d_sum, loss_weight, rounding_, d_dlogits);
  });
  cuda::check_launch("cross_entropy_backward");
  s.download(dlogits, d_dlogits, rows * vocab_local);
  s.finish();
}

void CudaBackend::adamw_update(double* param, const double* grad, double* exp_avg, double* exp_avg_sq,
                               int64_t n, const AdamWStep& step) {
  if (n == 0) return;
  const auto t = static_cast<double>(step.step);
  const double bias_correction1 = 1.0 - std::pow(step.beta1, t),
               bias_correction2 = 1.0 - std::pow(step.beta2, t);
  cuda::Staging& s = begin_call();
  double* d_param = s.upload(param, n);
  const double* d_grad = s.upload(grad, n);
  double* d_m = s.upload(exp_avg, n);
  double* d_v = s.upload(exp_avg_sq, n);
  const cuda::Launch launch = cuda::per_element(n);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(adamw_kernel<decltype(compute)>, launch, stream_, d_param, d_grad, d_m, d_v, n,
                        step.lr, step.beta1, step.beta2, step.eps, step.weight_decay, bias_correction1,
                        bias_correction2, step.grad_scale);
  });
  cuda::check_launch("adamw_update");
  s.download(param, d_param, n);
  s.download(exp_avg, d_m, n);
  s.download(exp_avg_sq, d_v, n);
  s.finish();
}

}  // namespace touchstone
