// DGEMM for FP64; SGEMM on exactly converted inputs for FP32 and BF16. The conversions and the store run
// parallel over rows (element-wise, so the thread count changes no bit); the BLAS calls thread themselves.
#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <vector>

#include "kernels/cpu/parallel_for.h"

namespace touchstone::cpu {

namespace {

int blas_int(int64_t value) { return static_cast<int>(value); }

// rows x cols of a row-major matrix with row stride ld, as contiguous floats.
std::vector<float> to_float(const double* m, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  parallel_for(rows, cols, [&](int64_t i) {
    for (int64_t j = 0; j < cols; ++j)
      out[static_cast<size_t>(i * cols + j)] = static_cast<float>(m[i * ld + j]);
  });
  return out;
}

double round_as(RoundTo round_to, double value) {
  switch (round_to) {
    case RoundTo::kFp32:
      return round_to_fp32(value);
    case RoundTo::kBf16:
      return round_to_bf16(value);
    case RoundTo::kNone:
      break;
  }
  return value;
}

}  // namespace

void gemm(Precision precision, RoundTo round_to, bool transpose_a, bool transpose_b, int64_t M, int64_t N,
          int64_t K, double alpha, const double* A, int64_t lda, const double* B, int64_t ldb, Store store,
          double* C, int64_t ldc) {
  const CBLAS_TRANSPOSE ta = transpose_a ? CblasTrans : CblasNoTrans,
                        tb = transpose_b ? CblasTrans : CblasNoTrans;
  if (precision == Precision::kFp64) {
    cblas_dgemm(CblasRowMajor, ta, tb, blas_int(M), blas_int(N), blas_int(K), alpha, A, blas_int(lda), B,
                blas_int(ldb), store == Store::kAccumulate ? 1.0 : 0.0, C, blas_int(ldc));
    return;
  }
  const int64_t a_rows = transpose_a ? K : M, a_cols = transpose_a ? M : K;
  const int64_t b_rows = transpose_b ? N : K, b_cols = transpose_b ? K : N;
  const std::vector<float> a = to_float(A, a_rows, a_cols, lda), b = to_float(B, b_rows, b_cols, ldb);
  std::vector<float> product(static_cast<size_t>(M * N));
  cblas_sgemm(CblasRowMajor, ta, tb, blas_int(M), blas_int(N), blas_int(K), static_cast<float>(alpha),
              a.data(), blas_int(a_cols), b.data(), blas_int(b_cols), 0.0f, product.data(), blas_int(N));
  parallel_for(M, N, [&](int64_t i) {
    for (int64_t j = 0; j < N; ++j) {
      const double p = static_cast<double>(product[static_cast<size_t>(i * N + j)]);
      double& c = C[i * ldc + j];
      c = store == Store::kAccumulate ? round_as(round_to, c + p) : round_as(round_to, p);
    }
  });
}

std::string blas_description() {
  return std::string(openblas_get_config()) + ", core " + openblas_get_corename();
}

}  // namespace touchstone::cpu
