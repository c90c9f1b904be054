// CUDA merge of attention over blocks of keys (Backend::attention_merge): the log-sum-exp rule of flash
// attention across key blocks, the device twin of the CPU reference's merge
// (kernels/cpu/attention_merge.cpp).
// One thread per query row and head, over d in ascending order; no sums across threads, no atomics.
//
// Compute type T: double in FP64 mode, float otherwise, as in attention.cu; out is stored as an
// activation (as the forward stores O), lse as a T value. Each product is rounded on its own
// (__fmul_rn), so nvcc's fused multiply-adds do not merge it into the following add.
#include <cmath>

#include "kernels/cuda/attention_math.cuh"
#include "kernels/cuda/cuda_backend.cuh"

namespace touchstone {

namespace {

using cuda::exp_of;
using cuda::log_of;
using cuda::rounded_product;

// out[b*Tq, NH*D], lse[b,NH,Tq] merged in place with one block's block_out, block_lse; thread per
// (b, i, h), in out's row order:
//   m = max(lse, block_lse),  lse' = m + log(exp(lse - m) + exp(block_lse - m)),
//   out' = exp(lse - lse') out + exp(block_lse - lse') block_out.
// A side at -inf (no key of its blocks visible to the row) leaves the other side's values as they are.
template <typename T>
__global__ void attention_merge_kernel(const double* block_out, const double* block_lse, AttentionShape shape,
                                       cpu::Rounding r, double* out, double* lse) {
  const int64_t seq = shape.seq, dim = shape.head_dim, heads = shape.num_heads;
  const T minus_infinity = static_cast<T>(-INFINITY);
  TOUCHSTONE_GRID_STRIDE_LOOP(row_head, shape.windows * seq * heads) {
    const int64_t h = row_head % heads, row = row_head / heads, b = row / seq, i = row % seq;
    const int64_t at = (b * heads + h) * seq + i;  // of lse [b,NH,Tq]
    double* o = out + row_head * dim;              // [D] of out's row b*Tq + i, head h
    const double* block_o = block_out + row_head * dim;
    const T before = static_cast<T>(lse[at]), added = static_cast<T>(block_lse[at]);
    if (added == minus_infinity) continue;  // the block holds no key this row sees
    if (before == minus_infinity) {         // no block before it held one
      for (int64_t d = 0; d < dim; ++d) o[d] = block_o[d];
      lse[at] = block_lse[at];
      continue;
    }
    const T m = max(before, added);
    const T merged = m + log_of(exp_of(before - m) + exp_of(added - m));
    const T before_weight = exp_of(before - merged), added_weight = exp_of(added - merged);
    for (int64_t d = 0; d < dim; ++d) {
      o[d] = r.activation(static_cast<double>(rounded_product(before_weight, static_cast<T>(o[d])) +
                                              rounded_product(added_weight, static_cast<T>(block_o[d]))));
    }
    lse[at] = static_cast<double>(merged);
  }
}

}  // namespace

void CudaBackend::attention_merge(const double* block_out, const double* block_lse,
                                  const AttentionShape& shape, double* out, double* lse) {
  const int64_t rows = shape.windows * shape.seq * shape.num_heads, elements = rows * shape.head_dim;
  if (rows == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_block_out = s.upload(block_out, elements);  // [b*Tq, NH*D]
  const double* d_block_lse = s.upload(block_lse, rows);      // [b,NH,Tq]
  double* d_out = s.upload(out, elements);                    // [b*Tq, NH*D], merged in place
  double* d_lse = s.upload(lse, rows);                        // [b,NH,Tq], merged in place
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(attention_merge_kernel<decltype(compute)>, cuda::per_element(rows), stream_,
                        d_block_out, d_block_lse, shape, rounding_, d_out, d_lse);
  });
  cuda::check_launch("attention_merge");
  s.download(out, d_out, elements);
  s.download(lse, d_lse, rows);
  s.finish();
}

}  // namespace touchstone
