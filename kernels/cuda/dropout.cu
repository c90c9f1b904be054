// CUDA inverted dropout: the masks drawn from global coordinates with the same Philox code as the CPU
// (common/philox.h), so a GPU mask is bitwise the CPU's, and the forward and backward of applying one.
#include "common/philox.h"
#include "kernels/cuda/cuda_backend.cuh"

namespace touchstone {

namespace {

__device__ double keep_scale_at(uint32_t key0, uint32_t key1, double probability, int64_t sample,
                                int64_t element, double kept) {
  const double u =
      philox::uniform_at(key0, key1, static_cast<uint64_t>(sample), static_cast<uint64_t>(element));
  return u > probability ? kept : 0.0;  // u in (0, 1]: kept with probability 1 - p
}

// keep_scale[b, NHl, T, T]: local (w, h, ij) is element (first_head + h) * T * T + ij of sample samples[w].
__global__ void attention_mask_kernel(uint32_t key0, uint32_t key1, double probability, double kept,
                                      const int64_t* samples, int64_t windows, int64_t heads, int64_t seq,
                                      int64_t first_head, double* keep_scale) {
  const int64_t per_head = seq * seq;
  TOUCHSTONE_GRID_STRIDE_LOOP(e, windows * heads * per_head) {
    const int64_t w = e / (heads * per_head), h = (e / per_head) % heads, ij = e % per_head;
    keep_scale[e] =
        keep_scale_at(key0, key1, probability, samples[w], (first_head + h) * per_head + ij, kept);
  }
}

// keep_scale[rows, H] for rows first_row.. of the micro-batch: global row w*T + i, column c is element
// i*H + c of sample samples[w].
__global__ void hidden_mask_kernel(uint32_t key0, uint32_t key1, double probability, double kept,
                                   const int64_t* samples, int64_t first_row, int64_t rows, int64_t seq,
                                   int64_t hidden, double* keep_scale) {
  TOUCHSTONE_GRID_STRIDE_LOOP(e, rows * hidden) {
    const int64_t row = first_row + e / hidden, c = e % hidden;
    keep_scale[e] =
        keep_scale_at(key0, key1, probability, samples[row / seq], (row % seq) * hidden + c, kept);
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

void CudaBackend::attention_dropout_mask(const DropoutSite& site, const AttentionShape& shape,
                                         int64_t first_head, double* keep_scale) {
  const int64_t n = shape.windows * shape.num_heads * shape.seq * shape.seq;
  if (n == 0) return;
  const double kept = rounding_.state(1.0 / (1.0 - site.probability));  // FP32 unless FP64, as on the CPU
  cuda::Staging& s = begin_call();
  const int64_t* d_samples = s.upload(site.sample_indices, shape.windows);  // [b]
  double* d_mask = s.output<double>(n);                                     // [b, NHl, T, T]
  const cuda::Launch launch = cuda::per_element(n);
  cuda::launch_kernel(attention_mask_kernel, launch, stream_, site.key[0], site.key[1], site.probability,
                      kept, d_samples, shape.windows, shape.num_heads, shape.seq, first_head, d_mask);
  cuda::check_launch("attention_dropout_mask");
  s.download(keep_scale, d_mask, n);
  s.finish();
}

void CudaBackend::hidden_dropout_mask(const DropoutSite& site, int64_t first_row, int64_t rows, int64_t seq,
                                      int64_t hidden, double* keep_scale) {
  if (rows * hidden == 0) return;
  const int64_t windows = (first_row + rows + seq - 1) / seq;  // the windows rows first_row.. reach into
  const double kept = rounding_.state(1.0 / (1.0 - site.probability));
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
