// Host-side arithmetic of the CUDA backend, in plain C++ so it is unit-tested on machines without a
// GPU: launch shapes, the row-major to cuBLAS (column-major) mapping, the embedding-gradient plan,
// the GEMM conversion workspace and which GPU a rank uses.
//
// Determinism (docs/cuda.md): every reduction kernel runs kBlockThreads threads per block. Thread t of
// a block adds elements t, t + kBlockThreads, t + 2 kBlockThreads, ... of its row in that order; the
// block then halves its partial sums in shared memory (slot t += slot t + s for s = 128, 64, ..., 1).
// The order depends only on the row length, never on the grid size, timing or the GPU model, and no
// reduction uses atomics, so two runs give the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/precision.h"

namespace touchstone::cuda {

constexpr int kBlockThreads = 256;  // every kernel; a power of two for the tree reduction
// Grid-stride kernels cap their grid: 4096 blocks of 256 threads fill any current GPU.
constexpr int64_t kMaxGridBlocks = 4096;

struct Launch {
  int64_t blocks = 0;
  int threads = kBlockThreads;
};

// One block per row (reductions over a row: RMSNorm, softmax, cross entropy, attention rows). CUDA's
// grid.x holds up to 2^31 - 1 blocks; more rows throw std::length_error.
Launch per_row(int64_t rows);
// Elementwise work over n elements, with a grid-stride loop: ceil(n / threads) blocks, at most
// kMaxGridBlocks. n = 0 gives 0 blocks (the caller skips the launch).
Launch per_element(int64_t n);

// A row-major product C[M,N] = alpha op(A)[M,K] op(B)[K,N] (+ beta C), with row strides lda, ldb, ldc,
// as the column-major call cuBLAS takes. A row-major matrix read as column-major is its transpose, so
// C^T = op(B)^T op(A)^T: cuBLAS computes an m x n = N x M product whose first operand is B.
struct ColumnMajorGemm {
  bool transpose_first;                 // op of the first operand (row-major B): transposed iff B is not
  bool transpose_second;                // op of the second operand (row-major A)
  int64_t m, n, k;                      // N, M, K
  int64_t ld_first, ld_second, ld_out;  // ldb, lda, ldc
};
// Throws std::invalid_argument when a leading dimension is shorter than its row.
ColumnMajorGemm column_major_gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K,
                                  int64_t lda, int64_t ldb, int64_t ldc);

// Elements of the FP32 or BF16 copies a lower-precision GEMM makes (its inputs converted from the
// double operands, and the FP32 product before it is rounded and stored): 0 in FP64, where DGEMM reads
// and writes the operands in place.
struct GemmWorkspace {
  int64_t a_elements = 0, b_elements = 0, product_elements = 0;
  int64_t bytes(Precision precision) const;
};
GemmWorkspace gemm_workspace(Precision precision, int64_t M, int64_t N, int64_t K);

// The embedding gradient without atomics: the rows of each vocabulary id in this rank's slice, so one
// thread per (id, column) adds that id's rows in ascending row order, the CPU reference's order.
// ids[u] ascending; rows of ids[u] are rows[offsets[u] .. offsets[u + 1]).
struct TokenRows {
  std::vector<int32_t> ids;      // local row of the table: token - vocab_start
  std::vector<int64_t> offsets;  // ids.size() + 1 entries
  std::vector<int64_t> rows;     // positions n of the micro-batch, ascending within an id
};
TokenRows token_rows(const int32_t* tokens, int64_t rows, int64_t vocab_start, int64_t vocab_local);

// The GPU a rank drives: local_rank modulo the devices it sees (one rank per GPU when the launcher
// starts as many ranks per node as GPUs). Throws std::runtime_error naming the count when there are none.
int device_for_local_rank(int local_rank, int device_count);

}  // namespace touchstone::cuda
