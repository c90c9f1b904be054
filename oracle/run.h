// A whole single-process run: everything is loaded and validated first (config, data, initial
// weights), then the step loop runs, printing one line per step, and the golden file is committed.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "data/packing.h"
#include "model/config.h"
#include "model/param_table.h"
#include "oracle/global_batch.h"
#include "oracle/golden_writer.h"

namespace touchstone {

struct RunOptions {
  std::string golden_path;                 // where to write the golden file; empty: none
  std::string init_from;                   // HDF5 file with initial parameters; empty: RNG init
  std::string init_group = "/params/init"; // group of init_from holding the tensors
  GoldenOptions golden;
};

struct PreparedRun {
  Config config;
  std::vector<data::Window> windows;  // the packed data set
  std::vector<GlobalBatch> batches;   // [train.steps]
  ParamTensors initial_params;
};

// Validates the config, loads and packs the data, draws or loads the initial parameters. Throws
// InputError for anything the user must fix; nothing has been computed or written yet.
PreparedRun prepare_run(const Config& config, const RunOptions& options);

// Runs the steps; writes the golden file when options.golden_path is set. Progress goes to `out`.
void execute_run(const PreparedRun& run, const RunOptions& options, std::ostream& out);

}  // namespace touchstone
