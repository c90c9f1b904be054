// The one matrix product of the CPU backend, in every precision.
//
// FP64 calls DGEMM. FP32 and BF16 call SGEMM: the inputs (already FP32 or BF16 values) are converted
// to float exactly, products are accumulated in FP32, and the result is stored in the output format
// (FP32, or BF16 for BF16 activations), or added to an FP32 accumulator (main gradients).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/precision.h"

namespace touchstone::cpu {

enum class Store {
  kOverwrite,   // C = round(A @ B)
  kAccumulate,  // C = round(C + A @ B)
};

enum class RoundTo { kNone, kFp32, kBf16 };

// The format a GEMM result stored as an activation takes: BF16 in BF16 mode, FP32 in FP32 mode.
inline RoundTo activation_format(Precision p) {
  return p == Precision::kBf16 ? RoundTo::kBf16 : p == Precision::kFp32 ? RoundTo::kFp32 : RoundTo::kNone;
}

// Row-major C[M,N] (row stride ldc) from op(A)[M,K], op(B)[K,N]; op = transpose when the flag is set.
void gemm(Precision precision, RoundTo round_to, bool transpose_a, bool transpose_b, int64_t M, int64_t N,
          int64_t K, double alpha, const double* A, int64_t lda, const double* B, int64_t ldb, Store store,
          double* C, int64_t ldc);

// The BLAS library and the kernel it chose for this CPU ("OpenBLAS 0.3.21 ... core Haswell"): FP32
// sums round differently per kernel, so test logs record it (OPENBLAS_CORETYPE forces one).
std::string blas_description();

}  // namespace touchstone::cpu
