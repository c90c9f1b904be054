// Launch shapes, the cuBLAS argument mapping and the embedding-gradient plan (kernels/cuda/launch.h).
#include "kernels/cuda/launch.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace touchstone::cuda {

Launch per_row(int64_t rows) {
  if (rows < 0) throw std::invalid_argument("per_row: negative row count " + std::to_string(rows));
  if (rows > std::numeric_limits<int32_t>::max()) {
    throw std::length_error("per_row: " + std::to_string(rows) + " rows exceed CUDA's 2^31 - 1 blocks");
  }
  return Launch{rows, kBlockThreads};
}

Launch per_element(int64_t n) {
  if (n < 0) throw std::invalid_argument("per_element: negative element count " + std::to_string(n));
  return Launch{std::min<int64_t>((n + kBlockThreads - 1) / kBlockThreads, kMaxGridBlocks), kBlockThreads};
}

ColumnMajorGemm column_major_gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K,
                                  int64_t lda, int64_t ldb, int64_t ldc) {
  // Row lengths of the stored (row-major) matrices.
  const int64_t a_row = transpose_a ? M : K, b_row = transpose_b ? K : N;
  if (lda < std::max<int64_t>(a_row, 1) || ldb < std::max<int64_t>(b_row, 1) ||
      ldc < std::max<int64_t>(N, 1)) {
    throw std::invalid_argument("gemm: leading dimension shorter than a row (lda " + std::to_string(lda) +
                                ", ldb " + std::to_string(ldb) + ", ldc " + std::to_string(ldc) + ")");
  }
  return ColumnMajorGemm{transpose_b, transpose_a, N, M, K, ldb, lda, ldc};
}

int64_t GemmWorkspace::bytes(Precision precision) const {
  const int64_t input_bytes = precision == Precision::kBf16 ? 2 : 4;
  return (a_elements + b_elements) * input_bytes + product_elements * 4;
}

GemmWorkspace gemm_workspace(Precision precision, int64_t M, int64_t N, int64_t K) {
  if (precision == Precision::kFp64) return {};
  return GemmWorkspace{M * K, K * N, M * N};
}

TokenRows token_rows(const int32_t* tokens, int64_t rows, int64_t vocab_start, int64_t vocab_local) {
  std::vector<int64_t> mine;  // positions whose token is in the slice
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t local = static_cast<int64_t>(tokens[n]) - vocab_start;
    if (local >= 0 && local < vocab_local) mine.push_back(n);
  }
  // Stable: equal ids keep ascending positions.
  std::stable_sort(mine.begin(), mine.end(), [&](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
  TokenRows plan;
  plan.rows = mine;
  plan.offsets.push_back(0);
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto id = static_cast<int32_t>(tokens[mine[i]] - vocab_start);
    if (plan.ids.empty() || plan.ids.back() != id) {
      if (!plan.ids.empty()) plan.offsets.push_back(static_cast<int64_t>(i));
      plan.ids.push_back(id);
    }
  }
  if (!plan.ids.empty()) plan.offsets.push_back(static_cast<int64_t>(mine.size()));
  return plan;
}

int device_for_local_rank(int local_rank, int device_count) {
  if (device_count <= 0) throw std::runtime_error("no CUDA device is visible to this process");
  if (local_rank < 0) throw std::invalid_argument("negative local rank " + std::to_string(local_rank));
  return local_rank % device_count;
}

}  // namespace touchstone::cuda
