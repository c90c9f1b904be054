// A run's checkpoints and records: saving the trainer's sharded state as one full-tensor checkpoint
// through world rank 0 (every rank takes part in the gathers), the data-parallel ranks' consumed
// samples for the sample ledger, and the recorder that does both after every step of a run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/fault_injection.h"
#include "checkpoint/ledger/ledger.h"
#include "common/config.h"
#include "oracle/global_batch.h"
#include "oracle/train_step.h"
#include "parallel/comm/context.h"

namespace touchstone {

// Checkpoints, resume and injected failures (docs/checkpoints.md).
struct CheckpointOptions {
  std::string directory;   // checkpoints, latest.json and the sample ledger; empty: none of them
  int64_t save_every = 0;  // >= 0: save after every N updates (0: none); the last update is always saved
  int keep = 2;            // >= 0: complete checkpoints kept (0: all)
  bool resume = false;     // continue from the latest complete checkpoint of `directory`, if any
  bool fallback = false;   // if the latest is refused, continue from the newest older one that verifies
  std::optional<ProcessFault> fail_at;  // that rank dies abruptly there (recovery tests)
};

// Collective over the world group: after update `step` (learning rate `lr`), gathers the master
// weights and AdamW moments to world rank 0, which writes and publishes the checkpoint in `store`.
// The "save" phase of an injected fault falls between the parameters and the optimizer state.
// `data_fingerprint` (data::content_fingerprint; empty: not recorded) is stored with it. Returns, on
// world rank 0, the published directory, its size and the wall time of the whole save.
struct SaveReport {
  std::filesystem::path directory;
  uintmax_t bytes = 0;
  double seconds = 0.0;
};
SaveReport save_checkpoint(const Trainer& trainer, const ParallelContext& context, const Config& config,
                           const CheckpointStore& store, int64_t step, double lr,
                           const std::string& data_fingerprint = "");

// Collective over the world group: on world rank 0, the global sample indices each data-parallel rank
// consumed in this step ([dp][samples in the order its micro-batches ran]), as reported by that
// rank's first pipeline stage; empty elsewhere.
std::vector<std::vector<int64_t>> gather_consumed_samples(const GlobalBatch& batch, const Config& config,
                                                          const ParallelContext& context);

// What a run with a checkpoint directory records (`options.directory` non-empty): after each step the
// ledger line (world rank 0 appends the samples every dp rank consumed and the step's totals) and,
// after every `save_every` updates and after the last, a checkpoint. Every rank constructs it and calls
// after_step (both gathers are collective); world rank 0 prints each save. An attempt that resumes
// (first_step > 1) first reconciles the ledger with the checkpoint it loaded
// (LedgerWriter::record_recovered_checkpoint). `data_fingerprint` (data::content_fingerprint) goes into
// every checkpoint and the ledger's start line.
class RunRecorder {
 public:
  RunRecorder(const CheckpointOptions& options, const Config& config, const ParallelContext& context,
              int64_t num_windows, const std::string& data_fingerprint, int64_t first_step,
              int64_t last_step);
  void after_step(const Trainer& trainer, const GlobalBatch& batch, const StepRecord& record,
                  std::ostream& out);
  void finish();  // the ledger's end record of a complete attempt

 private:
  const CheckpointOptions& options_;
  const Config& config_;
  const ParallelContext& context_;
  CheckpointStore store_;
  std::string data_fingerprint_;
  int64_t last_step_;
  std::unique_ptr<ledger::LedgerWriter> ledger_;  // world rank 0 only
};

// "1208.2 MB in 7.81 s, 155 MB/s"
std::string throughput_text(uintmax_t bytes, double seconds);

}  // namespace touchstone
