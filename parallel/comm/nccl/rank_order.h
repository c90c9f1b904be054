// The device half of the NCCL group's deterministic reductions (CUDA builds only): after an exchange,
// row r of `rows` holds group rank r's contribution, and these kernels combine the rows in rank
// order 0..n-1, element by element, exactly as the MPI group does on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace touchstone::nccl {

// rows[n * count] -> out[count]: out[i] = ((rows[0][i] + rows[1][i]) + rows[2][i]) + ..., in double.
// `out` must not overlap `rows`. Enqueued on `stream`; throws std::runtime_error on a launch error.
void sum_in_rank_order(const double* rows, int n, int64_t count, double* out, cudaStream_t stream);

// rows[n * count] -> out[count]: out[i] = ordered_max(...ordered_max(rows[0][i], rows[1][i])...)
// (parallel/comm/ordered_max.h); with n == 1 the row is copied unchanged, as a group of one does.
void max_in_rank_order(const double* rows, int n, int64_t count, double* out, cudaStream_t stream);

}  // namespace touchstone::nccl
