// cuBLAS GEMMs in every precision (kernels/cuda/gemm.cuh), with the CPU reference's rounding points.
#include <cuda_bf16.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/gemm.cuh"

namespace touchstone::cuda {

namespace {

int blas_int(int64_t value) {
  if (value > std::numeric_limits<int>::max()) {
    throw std::length_error("gemm dimension " + std::to_string(value) + " does not fit cuBLAS's int");
  }
  return static_cast<int>(value);
}

template <typename T>
__device__ T convert(double v);
template <>
__device__ float convert<float>(double v) {
  return static_cast<float>(v);
}
template <>
__device__ __nv_bfloat16 convert<__nv_bfloat16>(double v) {
  return __float2bfloat16_rn(static_cast<float>(v));  // exact: v already holds a BF16 value
}

// out[rows, cols] (contiguous) <- m[rows, cols] with row stride ld
template <typename T>
__global__ void convert_matrix(const double* m, int64_t rows, int64_t cols, int64_t ld, T* out) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, rows * cols) { out[i] = convert<T>(m[(i / cols) * ld + i % cols]); }
}

__device__ double round_as(cpu::RoundTo round_to, double value) {
  switch (round_to) {
    case cpu::RoundTo::kFp32:
      return round_to_fp32(value);
    case cpu::RoundTo::kBf16:
      return round_to_bf16(value);
    case cpu::RoundTo::kNone:
      break;
  }
  return value;
}

// C[M, N] (row stride ldc) <- round(product) or round(C + product), as cpu::gemm stores.
__global__ void store_product(const float* product, int64_t M, int64_t N, cpu::RoundTo round_to,
                              bool accumulate, double* C, int64_t ldc) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, M * N) {
    const double p = static_cast<double>(product[i]);
    double& c = C[(i / N) * ldc + i % N];
    c = accumulate ? round_as(round_to, c + p) : round_as(round_to, p);
  }
}

template <typename T>
T* converted(DeviceBytes& buffer, cudaStream_t stream, const double* m, int64_t rows, int64_t cols,
             int64_t ld) {
  T* out = static_cast<T*>(buffer.reserve(static_cast<size_t>(rows * cols) * sizeof(T)));
  const Launch launch = per_element(rows * cols);
  if (launch.blocks > 0) {
    launch_kernel(convert_matrix<T>, launch, stream, m, rows, cols, ld, out);
    check_launch("convert_matrix");
  }
  return out;
}

cublasOperation_t op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

void gemm(cublasHandle_t handle, cudaStream_t stream, GemmScratch& scratch, Precision precision,
          cpu::RoundTo round_to, bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K,
          double alpha, const double* A, int64_t lda, const double* B, int64_t ldb, cpu::Store store,
          double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const bool accumulate = store == cpu::Store::kAccumulate;
  if (precision == Precision::kFp64) {
    const ColumnMajorGemm g = column_major_gemm(transpose_a, transpose_b, M, N, K, lda, ldb, ldc);
    const double beta = accumulate ? 1.0 : 0.0;
    check(cublasDgemm(handle, op(g.transpose_first), op(g.transpose_second), blas_int(g.m), blas_int(g.n),
                      blas_int(g.k), &alpha, B, blas_int(g.ld_first), A, blas_int(g.ld_second), &beta, C,
                      blas_int(g.ld_out)),
          "cublasDgemm");
    return;
  }
  const int64_t a_rows = transpose_a ? K : M, a_cols = transpose_a ? M : K;
  const int64_t b_rows = transpose_b ? N : K, b_cols = transpose_b ? K : N;
  const bool bf16 = precision == Precision::kBf16;
  const void *a = nullptr, *b = nullptr;
  if (bf16) {
    a = converted<__nv_bfloat16>(scratch.a, stream, A, a_rows, a_cols, lda);
    b = converted<__nv_bfloat16>(scratch.b, stream, B, b_rows, b_cols, ldb);
  } else {
    a = converted<float>(scratch.a, stream, A, a_rows, a_cols, lda);
    b = converted<float>(scratch.b, stream, B, b_rows, b_cols, ldb);
  }
  auto* product = static_cast<float*>(scratch.product.reserve(static_cast<size_t>(M * N) * sizeof(float)));
  const ColumnMajorGemm g = column_major_gemm(transpose_a, transpose_b, M, N, K, a_cols, b_cols, N);
  const float alpha32 = static_cast<float>(alpha), beta32 = 0.0f;
  const cudaDataType_t input_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
  check(cublasGemmEx(handle, op(g.transpose_first), op(g.transpose_second), blas_int(g.m), blas_int(g.n),
                     blas_int(g.k), &alpha32, b, input_type, blas_int(g.ld_first), a, input_type,
                     blas_int(g.ld_second), &beta32, product, CUDA_R_32F, blas_int(g.ld_out), compute,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  const Launch launch = per_element(M * N);
  launch_kernel(store_product, launch, stream, product, M, N, round_to, accumulate, C, ldc);
  check_launch("store_product");
}

}  // namespace touchstone::cuda
