// Rank-order sum and ordered maximum of exchanged rows (parallel/comm/nccl/rank_order.h). One thread per
// element walks the rows in rank order, so the order of the additions depends only on n, never on
// the launch shape, and no atomics are involved.
#include "kernels/cuda/device.cuh"
#include "parallel/comm/nccl/rank_order.h"
#include "parallel/comm/ordered_max.h"

namespace touchstone::nccl {
namespace {

__global__ void sum_rows(const double* rows, int n, int64_t count, double* out) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, count) {
    double sum = rows[i];
    for (int r = 1; r < n; ++r) sum += rows[static_cast<int64_t>(r) * count + i];
    out[i] = sum;
  }
}

__global__ void max_rows(const double* rows, int n, int64_t count, double* out) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, count) {
    double max = rows[i];
    for (int r = 1; r < n; ++r) max = ordered_max(max, rows[static_cast<int64_t>(r) * count + i]);
    out[i] = max;
  }
}

}  // namespace

void sum_in_rank_order(const double* rows, int n, int64_t count, double* out, cudaStream_t stream) {
  const cuda::Launch launch = cuda::per_element(count);
  if (launch.blocks == 0) return;
  cuda::launch_kernel(sum_rows, launch, stream, rows, n, count, out);
  cuda::check_launch("sum_in_rank_order");
}

void max_in_rank_order(const double* rows, int n, int64_t count, double* out, cudaStream_t stream) {
  const cuda::Launch launch = cuda::per_element(count);
  if (launch.blocks == 0) return;
  cuda::launch_kernel(max_rows, launch, stream, rows, n, count, out);
  cuda::check_launch("max_in_rank_order");
}

}  // namespace touchstone::nccl
