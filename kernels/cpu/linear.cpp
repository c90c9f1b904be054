// CPU linear layers (OpenBLAS DGEMM), embedding lookup and the residual add.
#include <cblas.h>

#include "kernels/cpu/cpu_backend.h"

namespace touchstone {

namespace {
int blas_int(int64_t value) { return static_cast<int>(value); }
}  // namespace

void CpuBackend::linear_forward(const double* x, const double* weight, int64_t rows, int64_t in, int64_t out,
                                double* y) {
  // y[N,out] = x[N,in] @ W[out,in]^T
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(rows), blas_int(out), blas_int(in), 1.0, x,
              blas_int(in), weight, blas_int(in), 0.0, y, blas_int(out));
}

void CpuBackend::linear_backward(const double* dy, const double* x, const double* weight, int64_t rows,
                                 int64_t in, int64_t out, double* dx, double* dweight_accum) {
  // dx[N,in] = dy[N,out] @ W[out,in]
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(rows), blas_int(in), blas_int(out), 1.0, dy,
              blas_int(out), weight, blas_int(in), 0.0, dx, blas_int(in));
  // dW[out,in] += dy[N,out]^T @ x[N,in]
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(out), blas_int(in), blas_int(rows), 1.0, dy,
              blas_int(out), x, blas_int(in), 1.0, dweight_accum, blas_int(in));
}

void CpuBackend::embedding_forward(const int32_t* tokens, const double* table, int64_t rows, int64_t hidden,
                                   int64_t vocab_start, int64_t vocab_local, double* y) {
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t local = static_cast<int64_t>(tokens[n]) - vocab_start;
    const bool mine = local >= 0 && local < vocab_local;
    for (int64_t i = 0; i < hidden; ++i) y[n * hidden + i] = mine ? table[local * hidden + i] : 0.0;
  }
}

void CpuBackend::embedding_backward(const int32_t* tokens, const double* dy, int64_t rows, int64_t hidden,
                                    int64_t vocab_start, int64_t vocab_local, double* dtable_accum) {
  // Sequential over rows: a fixed summation order when a token repeats.
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t local = static_cast<int64_t>(tokens[n]) - vocab_start;
    if (local < 0 || local >= vocab_local) continue;
    for (int64_t i = 0; i < hidden; ++i) dtable_accum[local * hidden + i] += dy[n * hidden + i];
  }
}

void CpuBackend::add_inplace(double* x, const double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace touchstone
