// CUDA linear layers (cuBLAS through cuda::gemm), embedding lookup and gradient, the residual add and
// storage rounding; the device twin of kernels/cpu/linear.cpp.
#include "kernels/cuda/cuda_backend.cuh"

namespace touchstone {

namespace {

__global__ void round_kernel(cpu::Rounding r, TensorRole role, double* x, int64_t n) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, n) {
    x[i] = role == TensorRole::kState           ? r.state(x[i])
           : role == TensorRole::kComputeWeight ? r.weight(x[i])
                                                : r.activation(x[i]);
  }
}

// y[N,H]: row n is table row tokens[n] - vocab_start when that is in the slice, else 0.
__global__ void embedding_forward_kernel(const int32_t* tokens, const double* table, int64_t rows,
                                         int64_t hidden, int64_t vocab_start, int64_t vocab_local,
                                         double* y) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, rows * hidden) {
    const int64_t local = static_cast<int64_t>(tokens[i / hidden]) - vocab_start;
    y[i] = local >= 0 && local < vocab_local ? table[local * hidden + i % hidden] : 0.0;
  }
}

// One thread per (id of the plan, column): adds the id's rows in ascending order (launch.h TokenRows).
__global__ void embedding_backward_kernel(const int32_t* ids, const int64_t* offsets, const int64_t* rows,
                                          int64_t unique_ids, const double* dy, int64_t hidden,
                                          cpu::Rounding r, double* dtable_accum) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, unique_ids * hidden) {
    const int64_t u = i / hidden, column = i % hidden;
    double& g = dtable_accum[static_cast<int64_t>(ids[u]) * hidden + column];
    double sum = g;
    for (int64_t j = offsets[u]; j < offsets[u + 1]; ++j) sum = r.state(sum + dy[rows[j] * hidden + column]);
    g = sum;
  }
}

__global__ void add_kernel(double* x, const double* y, int64_t n, cpu::Rounding r) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, n) { x[i] = r.activation(x[i] + y[i]); }
}

}  // namespace

void CudaBackend::round(TensorRole role, double* x, int64_t n) {
  if (precision() == Precision::kFp64 || n == 0) return;
  cuda::Staging& s = begin_call();
  double* d = s.upload(x, n);
  const cuda::Launch launch = cuda::per_element(n);
  cuda::launch_kernel(round_kernel, launch, stream_, rounding_, role, d, n);
  cuda::check_launch("round");
  s.download(x, d, n);
  s.finish();
}

void CudaBackend::linear_forward(const double* x, const double* weight, int64_t rows, int64_t in, int64_t out,
                                 double* y) {
  cuda::Staging& s = begin_call();
  const double* dx = s.upload(x, rows * in);      // [N,in]
  const double* dw = s.upload(weight, out * in);  // [out,in]
  double* dy = s.output<double>(rows * out);      // [N,out]
  cuda::gemm(cublas_, stream_, gemm_scratch_, precision(), cpu::activation_format(precision()), false, true,
             rows, out, in, 1.0, dx, in, dw, in, cpu::Store::kOverwrite, dy, out);
  s.download(y, dy, rows * out);
  s.finish();
}

void CudaBackend::linear_backward(const double* dy, const double* x, const double* weight, int64_t rows,
                                  int64_t in, int64_t out, double* dx, double* dweight_accum) {
  // A null dx or dweight_accum is not computed (backend.h): the split backward's two halves.
  cuda::Staging& s = begin_call();
  const double* d_dy = s.upload(dy, rows * out);  // [N,out]
  double* d_dx = nullptr;                         // [N,in]
  if (dx != nullptr) {
    const double* d_w = s.upload(weight, out * in);  // [out,in]
    d_dx = s.output<double>(rows * in);
    cuda::gemm(cublas_, stream_, gemm_scratch_, precision(), cpu::activation_format(precision()), false,
               false, rows, in, out, 1.0, d_dy, out, d_w, in, cpu::Store::kOverwrite, d_dx, in);
  }
  double* d_dw = nullptr;  // [out,in] main gradient
  if (dweight_accum != nullptr) {
    const double* d_x = s.upload(x, rows * in);  // [N,in]
    d_dw = s.upload(dweight_accum, out * in);
    if (precision() == Precision::kBf16 && !options_.grad_accumulation_fusion) {
      // Without fusion the micro-batch's weight gradient is stored in BF16, then added in FP32.
      double* micro = s.output<double>(out * in);
      cuda::gemm(cublas_, stream_, gemm_scratch_, precision(), cpu::RoundTo::kBf16, true, false, out, in,
                 rows, 1.0, d_dy, out, d_x, in, cpu::Store::kOverwrite, micro, in);
      const cuda::Launch launch = cuda::per_element(out * in);
      if (launch.blocks > 0) {
        cuda::launch_kernel(add_kernel, launch, stream_, d_dw, micro, out * in,
                            cpu::Rounding{Precision::kFp32});
        cuda::check_launch("add (weight gradient)");
      }
    } else {
      cuda::gemm(cublas_, stream_, gemm_scratch_, precision(),
                 precision() == Precision::kFp64 ? cpu::RoundTo::kNone : cpu::RoundTo::kFp32, true, false,
                 out, in, rows, 1.0, d_dy, out, d_x, in, cpu::Store::kAccumulate, d_dw, in);
    }
  }
  if (d_dx != nullptr) s.download(dx, d_dx, rows * in);
  if (d_dw != nullptr) s.download(dweight_accum, d_dw, out * in);
  s.finish();
}

void CudaBackend::embedding_forward(const int32_t* tokens, const double* table, int64_t rows, int64_t hidden,
                                    int64_t vocab_start, int64_t vocab_local, double* y) {
  cuda::Staging& s = begin_call();
  const int32_t* d_tokens = s.upload(tokens, rows);               // [N]
  const double* d_table = s.upload(table, vocab_local * hidden);  // [Vl,H]
  double* d_y = s.output<double>(rows * hidden);                  // [N,H]
  const cuda::Launch launch = cuda::per_element(rows * hidden);
  if (launch.blocks > 0) {
    cuda::launch_kernel(embedding_forward_kernel, launch, stream_, d_tokens, d_table, rows, hidden,
                        vocab_start, vocab_local, d_y);
    cuda::check_launch("embedding_forward");
  }
  s.download(y, d_y, rows * hidden);
  s.finish();
}

void CudaBackend::embedding_backward(const int32_t* tokens, const double* dy, int64_t rows, int64_t hidden,
                                     int64_t vocab_start, int64_t vocab_local, double* dtable_accum) {
  const cuda::TokenRows plan = cuda::token_rows(tokens, rows, vocab_start, vocab_local);
  if (plan.ids.empty()) return;  // no token of this micro-batch is in the slice
  cuda::Staging& s = begin_call();
  const auto unique_ids = static_cast<int64_t>(plan.ids.size());
  const int32_t* d_ids = s.upload(plan.ids.data(), unique_ids);
  const int64_t* d_offsets = s.upload(plan.offsets.data(), unique_ids + 1);
  const int64_t* d_rows = s.upload(plan.rows.data(), static_cast<int64_t>(plan.rows.size()));
  const double* d_dy = s.upload(dy, rows * hidden);                // [N,H]
  double* d_table = s.upload(dtable_accum, vocab_local * hidden);  // [Vl,H]
  const cuda::Launch launch = cuda::per_element(unique_ids * hidden);
  cuda::launch_kernel(embedding_backward_kernel, launch, stream_, d_ids, d_offsets, d_rows, unique_ids, d_dy,
                      hidden, rounding_, d_table);
  cuda::check_launch("embedding_backward");
  s.download(dtable_accum, d_table, vocab_local * hidden);
  s.finish();
}

void CudaBackend::add_inplace(double* x, const double* y, int64_t n) {
  if (n == 0) return;
  cuda::Staging& s = begin_call();
  double* d_x = s.upload(x, n);
  const double* d_y = s.upload(y, n);
  const cuda::Launch launch = cuda::per_element(n);
  cuda::launch_kernel(add_kernel, launch, stream_, d_x, d_y, n, rounding_);
  cuda::check_launch("add_inplace");
  s.download(x, d_x, n);
  s.finish();
}

}  // namespace touchstone
