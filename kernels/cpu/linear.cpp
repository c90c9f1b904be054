// CPU linear layers, embedding lookup, the residual add, and storage rounding. The loops run parallel
// over elements, rows or column blocks by parallel_for.h's rule.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_for.h"

namespace touchstone {

void CpuBackend::round(TensorRole role, double* x, int64_t n) {
  if (precision() == Precision::kFp64) return;
  cpu::parallel_for(n, 1, [&](int64_t i) {
    x[i] = role == TensorRole::kState           ? rounding_.state(x[i])
           : role == TensorRole::kComputeWeight ? rounding_.weight(x[i])
                                                : rounding_.activation(x[i]);
  });
}

void CpuBackend::linear_forward(const double* x, const double* weight, int64_t rows, int64_t in, int64_t out,
                                double* y) {
  // y[N,out] = x[N,in] @ W[out,in]^T
  cpu::gemm(precision(), cpu::activation_format(precision()), false, true, rows, out, in, 1.0, x, in, weight,
            in, cpu::Store::kOverwrite, y, out);
}

void CpuBackend::linear_backward(const double* dy, const double* x, const double* weight, int64_t rows,
                                 int64_t in, int64_t out, double* dx, double* dweight_accum) {
  // dx[N,in] = dy[N,out] @ W[out,in]
  if (dx != nullptr) {
    cpu::gemm(precision(), cpu::activation_format(precision()), false, false, rows, in, out, 1.0, dy, out,
              weight, in, cpu::Store::kOverwrite, dx, in);
  }
  if (dweight_accum == nullptr) return;
  // dW[out,in] += dy[N,out]^T @ x[N,in], into the main gradient (FP32 unless FP64). Without
  // gradient-accumulation fusion a BF16 run first stores this micro-batch's result in BF16.
  if (precision() == Precision::kBf16 && !options_.grad_accumulation_fusion) {
    std::vector<double> micro(static_cast<size_t>(out * in));
    cpu::gemm(precision(), cpu::RoundTo::kBf16, true, false, out, in, rows, 1.0, dy, out, x, in,
              cpu::Store::kOverwrite, micro.data(), in);
    cpu::parallel_for(out * in, 1, [&](int64_t i) {
      dweight_accum[i] = rounding_.state(dweight_accum[i] + micro[static_cast<size_t>(i)]);
    });
    return;
  }
  cpu::gemm(precision(), precision() == Precision::kFp64 ? cpu::RoundTo::kNone : cpu::RoundTo::kFp32, true,
            false, out, in, rows, 1.0, dy, out, x, in, cpu::Store::kAccumulate, dweight_accum, in);
}

void CpuBackend::embedding_forward(const int32_t* tokens, const double* table, int64_t rows, int64_t hidden,
                                   int64_t vocab_start, int64_t vocab_local, double* y) {
  cpu::parallel_for(rows, hidden, [&](int64_t n) {
    const int64_t local = static_cast<int64_t>(tokens[n]) - vocab_start;
    const bool mine = local >= 0 && local < vocab_local;
    for (int64_t i = 0; i < hidden; ++i) y[n * hidden + i] = mine ? table[local * hidden + i] : 0.0;
  });
}

void CpuBackend::embedding_backward(const int32_t* tokens, const double* dy, int64_t rows, int64_t hidden,
                                    int64_t vocab_start, int64_t vocab_local, double* dtable_accum) {
  // Parallel over blocks of hidden columns, each block sequential over rows: a repeated token's
  // gradient sums in row order whatever the thread count.
  constexpr int64_t kColumnBlock = 64;
  cpu::parallel_for((hidden + kColumnBlock - 1) / kColumnBlock, rows * kColumnBlock, [&](int64_t block) {
    const int64_t begin = block * kColumnBlock, end = std::min(hidden, begin + kColumnBlock);
    for (int64_t n = 0; n < rows; ++n) {
      const int64_t local = static_cast<int64_t>(tokens[n]) - vocab_start;
      if (local < 0 || local >= vocab_local) continue;
      for (int64_t i = begin; i < end; ++i) {
        double& g = dtable_accum[local * hidden + i];
        g = rounding_.state(g + dy[n * hidden + i]);
      }
    }
  });
}

void CpuBackend::add_inplace(double* x, const double* y, int64_t n) {
  if (precision() == Precision::kFp64) {  // nothing to round: a loop without a branch, vectorized
    cpu::parallel_for(n, 1, [&](int64_t i) { x[i] += y[i]; });
    return;
  }
  cpu::parallel_for(n, 1, [&](int64_t i) { x[i] = rounding_.activation(x[i] + y[i]); });
}

}  // namespace touchstone
