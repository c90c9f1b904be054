// The CUDA backend's host-side arithmetic (kernels/cuda/launch.h), which runs without a GPU: launch
// shapes, the row-major to column-major cuBLAS mapping (checked by executing the mapped call with a
// plain column-major GEMM, as cuBLAS defines it), the GEMM workspace, the embedding-gradient plan and
// the device choice.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "kernels/cuda/launch.h"

namespace touchstone::cuda {
namespace {

TEST(CudaLaunch, OneBlockPerRowWithTheFixedBlockSize) {
  EXPECT_EQ(per_row(37).blocks, 37);
  EXPECT_EQ(per_row(37).threads, kBlockThreads);
  EXPECT_EQ(per_row(0).blocks, 0);
  EXPECT_THROW(per_row(int64_t{1} << 31), std::length_error);
  EXPECT_THROW(per_row(-1), std::invalid_argument);
}

TEST(CudaLaunch, ElementwiseGridCoversEveryElementAndIsCapped) {
  EXPECT_EQ(per_element(0).blocks, 0);
  EXPECT_EQ(per_element(1).blocks, 1);
  EXPECT_EQ(per_element(kBlockThreads).blocks, 1);
  EXPECT_EQ(per_element(kBlockThreads + 1).blocks, 2);
  EXPECT_EQ(per_element(int64_t{1} << 40).blocks, kMaxGridBlocks);  // the grid-stride loop covers the rest
}

TEST(CudaLaunch, BlockSizeIsAPowerOfTwoForTheTreeReduction) {
  EXPECT_EQ(kBlockThreads & (kBlockThreads - 1), 0);
}

// cuBLAS's definition: C[m,n] = alpha op(A) op(B) + beta C, column-major with leading dimensions.
void column_major_reference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* A, int64_t lda,
                            const double* B, int64_t ldb, double* C, int64_t ldc) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double a = ta ? A[p + i * lda] : A[i + p * lda];
        const double b = tb ? B[j + p * ldb] : B[p + j * ldb];
        sum += a * b;
      }
      C[i + j * ldc] = sum;
    }
  }
}

TEST(CudaLaunch, ColumnMajorMappingComputesTheRowMajorProduct) {
  const int64_t M = 3, N = 5, K = 4, pad = 2;  // padded leading dimensions catch a swapped ld
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
      const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
      std::vector<double> A(static_cast<size_t>(a_rows * lda)), B(static_cast<size_t>(b_rows * ldb));
      for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<double>(i % 7) - 3.0;
      for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<double>(i % 5) - 2.0;
      // Row-major expectation: C[i][j] = sum_p op(A)[i][p] op(B)[p][j].
      std::vector<double> expected(static_cast<size_t>(M * ldc), 0.0), got(static_cast<size_t>(M * ldc), 0.0);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double sum = 0.0;
          for (int64_t p = 0; p < K; ++p) {
            sum += (ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
          }
          expected[static_cast<size_t>(i * ldc + j)] = sum;
        }
      }
      const ColumnMajorGemm g = column_major_gemm(ta, tb, M, N, K, lda, ldb, ldc);
      column_major_reference(g.transpose_first, g.transpose_second, g.m, g.n, g.k, B.data(), g.ld_first,
                             A.data(), g.ld_second, got.data(), g.ld_out);
      EXPECT_EQ(got, expected) << "transpose_a " << ta << ", transpose_b " << tb;
    }
  }
}

TEST(CudaLaunch, ColumnMajorMappingRejectsShortLeadingDimensions) {
  EXPECT_THROW(column_major_gemm(false, true, 3, 5, 4, 3, 4, 5), std::invalid_argument);   // lda < K
  EXPECT_THROW(column_major_gemm(false, false, 3, 5, 4, 4, 4, 5), std::invalid_argument);  // ldb < N
  EXPECT_THROW(column_major_gemm(false, false, 3, 5, 4, 4, 5, 4), std::invalid_argument);  // ldc < N
  EXPECT_NO_THROW(column_major_gemm(true, true, 3, 5, 4, 3, 4, 5));
}

TEST(CudaLaunch, GemmWorkspaceIsTheConvertedOperandsAndTheFp32Product) {
  EXPECT_EQ(gemm_workspace(Precision::kFp64, 3, 5, 4).bytes(Precision::kFp64), 0);
  const GemmWorkspace w = gemm_workspace(Precision::kBf16, 3, 5, 4);
  EXPECT_EQ(w.a_elements, 12);
  EXPECT_EQ(w.b_elements, 20);
  EXPECT_EQ(w.product_elements, 15);
  EXPECT_EQ(w.bytes(Precision::kBf16), (12 + 20) * 2 + 15 * 4);
  EXPECT_EQ(gemm_workspace(Precision::kFp32, 3, 5, 4).bytes(Precision::kFp32), (12 + 20) * 4 + 15 * 4);
}

TEST(CudaLaunch, TokenRowsGroupPositionsByIdInAscendingOrder) {
  // Slice [10, 14): tokens 9 and 14 are another rank's.
  const std::vector<int32_t> tokens = {12, 10, 9, 12, 13, 14, 10, 12};
  const TokenRows plan = token_rows(tokens.data(), static_cast<int64_t>(tokens.size()), 10, 4);
  EXPECT_EQ(plan.ids, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(plan.offsets, (std::vector<int64_t>{0, 2, 5, 6}));
  EXPECT_EQ(plan.rows, (std::vector<int64_t>{1, 6, 0, 3, 7, 4}));
}

TEST(CudaLaunch, TokenRowsOfAMicroBatchWithoutTokensInTheSliceIsEmpty) {
  const std::vector<int32_t> tokens = {1, 2, 3};
  const TokenRows plan = token_rows(tokens.data(), 3, 10, 4);
  EXPECT_TRUE(plan.ids.empty());
  EXPECT_TRUE(plan.rows.empty());
  EXPECT_EQ(plan.offsets, (std::vector<int64_t>{0}));
}

TEST(CudaLaunch, EachLocalRankDrivesOneDeviceRoundRobin) {
  EXPECT_EQ(device_for_local_rank(0, 8), 0);
  EXPECT_EQ(device_for_local_rank(7, 8), 7);
  EXPECT_EQ(device_for_local_rank(9, 8), 1);
  EXPECT_THROW(device_for_local_rank(0, 0), std::runtime_error);
  EXPECT_THROW(device_for_local_rank(-1, 2), std::invalid_argument);
}

}  // namespace
}  // namespace touchstone::cuda
