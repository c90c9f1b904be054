// Entry and exit of tensor-parallel regions: identity / all-reduce, or all-gather / reduce-scatter.
#include "parallel/tensor/regions.h"

namespace touchstone {

void TensorParallelRegion::gather(const ActivationBuffer& local, int64_t rows, int64_t cols,
                                  ActivationBuffer& full) const {
  if (!sequence_parallel_) {
    full = local;
    return;
  }
  full.resize(static_cast<size_t>(rows * cols));
  tp_.all_gather(local.data(), full.data(), local_rows(rows) * cols, {local_rows(rows), cols});
}

void TensorParallelRegion::reduce(ActivationBuffer& partial, int64_t rows, int64_t cols,
                                  ActivationBuffer& local) const {
  if (!sequence_parallel_) {
    tp_.all_reduce_sum(partial.data(), rows * cols, {rows, cols});
    local = std::move(partial);
  } else {
    local.resize(static_cast<size_t>(local_rows(rows) * cols));
    tp_.reduce_scatter_sum(partial.data(), local.data(), local_rows(rows) * cols, {rows, cols});
  }
  if (tp_.size() > 1)
    backend_.round(TensorRole::kActivation, local.data(), static_cast<int64_t>(local.size()));
}

}  // namespace touchstone
