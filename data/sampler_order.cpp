// Megatron-LM's sampler order (see sampler_order.h).
#include "data/sampler_order.h"

namespace touchstone {

std::vector<int64_t> micro_batch_starts(int64_t global_batch_size, int64_t micro_batch_size, int dp,
                                        int dp_rank) {
  std::vector<int64_t> starts;
  for (int64_t j = 0; j < global_batch_size / (micro_batch_size * dp); ++j) {
    starts.push_back(j * micro_batch_size * dp + dp_rank * micro_batch_size);
  }
  return starts;
}

}  // namespace touchstone
