// Megatron-LM's sampler order: which global samples each data-parallel rank consumes, in which order.
// Shared by the training step (which reads them) and the sample ledger's check (which verifies them).
#pragma once

#include <cstdint>
#include <vector>

namespace touchstone {

// First window of each micro-batch data-parallel rank `dp_rank` runs: micro-batch j holds the global
// samples j*mbs*dp + dp_rank*mbs ... + mbs - 1 (Megatron-LM's sampler order).
std::vector<int64_t> micro_batch_starts(int64_t global_batch_size, int64_t micro_batch_size, int dp,
                                        int dp_rank);

}  // namespace touchstone
