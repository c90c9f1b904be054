// CUDA inverted dropout of the hidden states: the mask drawn from global coordinates with the same
// Philox code as the CPU (dropout_mask.cuh), so a GPU mask is bitwise the CPU's, and the forward and
// backward of applying one. The attention mask is drawn inside the attention kernels (attention.cu).
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/dropout_mask.cuh"
#include "kernels/dropout_mask.h"

namespace touchstone {

namespace {

// keep_scale[rows, H] for rows first_row.. of the micro-batch: global row w*T + i, column c is element
// i*H + c of sample samples[w].
__global__ void hidden_mask_kernel(uint32_t key0, uint32_t key1, double probability, double kept,
                                   const int64_t* samples, int64_t first_row, int64_t rows, int64_t seq,
                                   int64_t hidden, double* keep_scale) {
  TOUCHSTONE_GRID_STRIDE_LOOP(e, rows * hidden) {
    const int64_t row = first_row + e / hidden, c = e % hidden;
    keep_scale[e] =
        cuda::keep_scale_at(key0, key1, probability, samples[row / seq], (row % seq) * hidden + c, kept);
  }
}

// y[n] = x[n] * keep_scale[n] in T, stored as an activation (forward and backward alike).
template <typename T>
__global__ void multiply_kernel(const double* x, const double* keep_scale, int64_t n, cpu::Rounding r,
                                double* y) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, n) {
    y[i] = r.activation(static_cast<double>(static_cast<T>(x[i]) * static_cast<T>(keep_scale[i])));
  }
}

}  // namespace

void CudaBackend::hidden_dropout_mask(const DropoutSite& site, int64_t first_row, int64_t rows, int64_t seq,
                                      int64_t hidden, double* keep_scale) {
  if (rows * hidden == 0) return;
  const int64_t windows = (first_row + rows + seq - 1) / seq;  // the windows rows first_row.. reach into
  const double kept = dropout_kept_value(site.probability, rounding_);  // FP32 unless FP64
  cuda::Staging& s = begin_call();
  const int64_t* d_samples = s.upload(site.sample_indices, windows);  // [windows]
  double* d_mask = s.output<double>(rows * hidden);                   // [rows, H]
  const cuda::Launch launch = cuda::per_element(rows * hidden);
  cuda::launch_kernel(hidden_mask_kernel, launch, stream_, site.key[0], site.key[1], site.probability, kept,
                      d_samples, first_row, rows, seq, hidden, d_mask);
  cuda::check_launch("hidden_dropout_mask");
  s.download(keep_scale, d_mask, rows * hidden);
  s.finish();
}

void CudaBackend::dropout_forward(const double* x, const double* keep_scale, int64_t n, double* y) {
  if (n == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_x = s.upload(x, n);
  const double* d_mask = s.upload(keep_scale, n);
  double* d_y = s.output<double>(n);
  const cuda::Launch launch = cuda::per_element(n);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(multiply_kernel<decltype(compute)>, launch, stream_, d_x, d_mask, n, rounding_, d_y);
  });
  cuda::check_launch("dropout_forward");
  s.download(y, d_y, n);
  s.finish();
}

void CudaBackend::dropout_backward(const double* dy, const double* keep_scale, int64_t n, double* dx) {
  // d(x * m) / dx = m: the same multiply as the forward.
  dropout_forward(dy, keep_scale, n, dx);
}

}  // namespace touchstone
