// The global batch of one optimizer step: B windows in global sample order, and its micro-batches.
#pragma once

#include <cstdint>
#include <vector>

#include "data/packing.h"
#include "model/transformer.h"
#include "parallel/context/load_balanced_split.h"

namespace touchstone {

// One cp rank's rows of a micro-batch (context parallelism): its two chunks of every window, with their
// tokens, targets, RoPE positions and document ids, and where each row sits in its window. `batch`
// points into these vectors (and, for the whole windows' document ids and the sample indices, into the
// global batch, which must outlive it); moving the struct keeps the pointers valid.
struct ContextMicroBatch {
  std::vector<int32_t> tokens, targets, position_ids, document_ids, window_positions;  // [b * T/cp]
  MicroBatch batch;
};

struct GlobalBatch {
  int64_t windows = 0;                  // B
  int64_t seq = 0;                      // T
  std::vector<int64_t> sample_indices;  // [B] global sample index of each row
  std::vector<int32_t> tokens;          // [B*T]
  std::vector<int32_t> targets;         // [B*T]
  std::vector<int32_t> position_ids;    // [B*T]
  std::vector<int32_t> document_ids;    // [B*T]

  // Windows [first, first + count) as one micro-batch.
  MicroBatch micro_batch(int64_t first, int64_t count) const;
  // cp rank `rank`'s rows of that micro-batch, split as `split` says.
  ContextMicroBatch context_micro_batch(int64_t first, int64_t count, const LoadBalancedSplit& split,
                                        int rank) const;
  // Positions with a target (target != -100) in windows [first, first + count).
  int64_t loss_tokens(int64_t first, int64_t count) const;
};

// The batch of update `step` (1-based): global samples (step-1)*B ... step*B-1. Sample k reads window
// k mod W, so a run longer than the data starts the windows again in the same order (no shuffling).
GlobalBatch make_global_batch(const std::vector<data::Window>& windows, int64_t global_batch_size,
                              int64_t step);

}  // namespace touchstone
