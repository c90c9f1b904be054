// The two communication points of a tensor-parallel region (Megatron-LM's mappings), in one place.
//
// Inside a region each tp rank computes with its shard of the weights on the full sequence. At the
// region's entry (before a ColumnParallelLinear) the full input is assembled; at its exit (after a
// RowParallelLinear or the vocab-parallel embedding) the ranks' partial sums are added. The residual
// stream between regions is either replicated on every tp rank or, with sequence parallelism, split
// into tp blocks of rows:
//
//                      gather (entry, forward)     reduce (exit, forward)
//   plain TP           identity                    all-reduce sum
//   sequence parallel  all-gather rows             reduce-scatter rows
//
// Each one's backward is the other one (the conjugate pair f / g of the Megatron-LM paper): the
// backward of an entry reduces the input gradient's partial sums, the backward of an exit gathers the
// output gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "common/activation_arena.h"
#include "kernels/backend.h"
#include "parallel/comm/process_group.h"

namespace touchstone {

class TensorParallelRegion {
 public:
  TensorParallelRegion(ProcessGroup& tp, bool sequence_parallel, Backend& backend)
      : tp_(tp), sequence_parallel_(sequence_parallel), backend_(backend) {}

  int tp_rank() const { return tp_.rank(); }
  int tp_size() const { return tp_.size(); }
  bool sequence_parallel() const { return sequence_parallel_; }
  ProcessGroup& group() const { return tp_; }

  // Rows of the residual stream this rank holds for `rows` rows of the full sequence.
  int64_t local_rows(int64_t rows) const { return sequence_parallel_ ? rows / tp_.size() : rows; }
  // The first of those rows in the full sequence: this rank's block starts there (0 without sequence
  // parallelism, where every rank holds all rows).
  int64_t first_local_row(int64_t rows) const {
    return sequence_parallel_ ? tp_.rank() * local_rows(rows) : 0;
  }

  // local[local_rows, cols] -> full[rows, cols]
  void gather(const ActivationBuffer& local, int64_t rows, int64_t cols, ActivationBuffer& full) const;
  // partial[rows, cols] (this rank's partial sums) -> local[local_rows, cols] holding the sum, stored
  // as an activation (a BF16 sum in BF16 mode, as a BF16 all-reduce delivers it)
  void reduce(ActivationBuffer& partial, int64_t rows, int64_t cols, ActivationBuffer& local) const;

 private:
  ProcessGroup& tp_;
  bool sequence_parallel_;
  Backend& backend_;
};

}  // namespace touchstone
