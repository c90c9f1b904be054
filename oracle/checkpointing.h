// A run's checkpoints: saving the trainer's sharded state as one full-tensor checkpoint through world
// rank 0 (every rank takes part in the gathers), and the data-parallel ranks' consumed samples for the
// sample ledger.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "model/config.h"
#include "oracle/global_batch.h"
#include "oracle/train_step.h"
#include "parallel/context.h"

namespace touchstone {

// Collective over the world group: after update `step` (learning rate `lr`), gathers the master
// weights and AdamW moments to world rank 0, which writes and publishes the checkpoint in `store`.
// The "save" phase of an injected fault falls between the parameters and the optimizer state.
// Returns, on world rank 0, the published directory, its size and the wall time of the whole save.
struct SaveReport {
  std::filesystem::path directory;
  int64_t bytes = 0;
  double seconds = 0.0;
};
SaveReport save_checkpoint(const Trainer& trainer, const ParallelContext& context, const Config& config,
                           const CheckpointStore& store, int64_t step, double lr);

// Collective over the world group: on world rank 0, the global sample indices each data-parallel rank
// consumed in this step ([dp][samples in the order its micro-batches ran]), as reported by that
// rank's first pipeline stage; empty elsewhere.
std::vector<std::vector<int64_t>> gather_consumed_samples(const GlobalBatch& batch, const Config& config,
                                                          const ParallelContext& context);

}  // namespace touchstone
