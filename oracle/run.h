// A whole run on one rank of the grid: everything is loaded and validated first (config, data,
// initial weights), then the step loop runs; world rank 0 prints one line per step and writes the
// golden file from full tensors gathered from every rank.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.h"
#include "common/config.h"
#include "data/packing.h"
#include "kernels/backend.h"
#include "model/param_table.h"
#include "oracle/checkpointing.h"
#include "oracle/global_batch.h"
#include "oracle/golden/golden_writer.h"
#include "parallel/comm/grid.h"

namespace touchstone {

struct RunOptions {
  std::string golden_path;                  // where to write the golden file; empty: none
  std::string init_from;                    // HDF5 file with initial parameters; empty: RNG init
  std::string init_group = "/params/init";  // group of init_from holding the tensors
  GoldenOptions golden;
  bool trace = false;                       // print every transfer and the pipeline timeline
  std::string timeline_svg;                 // write the last step's pipeline timeline here (rank 0)
  bool envelope = false;                    // also run FP64 and record the error envelope (golden)
  BackendKind backend = BackendKind::kCpu;  // the kernels (kernels/backend.h make_backend)
  CheckpointOptions checkpoint;
};

struct PreparedRun {
  Config config;
  std::vector<data::Window> windows;  // the packed data set
  std::string data_fingerprint;       // its content (data::content_fingerprint), with a checkpoint directory
  std::vector<GlobalBatch> batches;   // [train.steps]
  ParamTensors initial_params;        // full tensors
  // When resuming: the checkpoint continued from (its directory) and its state; the run goes on with
  // update resumed->step + 1.
  std::optional<TrainingState> resumed;
  std::string resumed_from;
  std::vector<std::string> refused_checkpoints;  // newer ones skipped by the fallback, and why
  double load_seconds = 0.0;                     // reading and verifying it (on this rank)
};

// Validates the config against `world_size`, loads and packs the data, draws or loads the initial
// parameters, and with options.checkpoint.resume loads and verifies the latest checkpoint. Throws InputError
// for anything the user must fix; nothing has been computed or written. The options' own values are the
// caller's to check (the command line does, naming its flags); this refuses only the combinations whose
// outputs would be wrong: an envelope at FP64 precision or with checkpoints, a golden file of a resumed run.
PreparedRun prepare_run(const Config& config, const RunOptions& options, int world_size = 1);

// Where a run stands in the training: it performs updates first_update(run) ... train.steps, update s
// on batch_of_update(run, s), whose sample indices also key its dropout masks. A fresh run starts at 1;
// a run resumed from the checkpoint of update k at k + 1, on global samples k*B ... k*B + B - 1.
int64_t first_update(const PreparedRun& run);
const GlobalBatch& batch_of_update(const PreparedRun& run, int64_t update);

// Runs the steps on this rank; `out` receives the per-step lines (world rank 0 only) and, with
// options.trace, this rank's transfer trace. Takes the run: its full initial weights are released once
// the trainer holds them.
void execute_run(PreparedRun run, const RunOptions& options, Grid& grid, std::ostream& out);

}  // namespace touchstone
