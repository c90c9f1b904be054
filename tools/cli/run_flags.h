// The flags of `touchstone golden` and `touchstone train`: declared for CLI11, then parsed into the
// library's RunOptions and checked. Every rule that concerns the flags alone is checked here, so that
// its error names the flags the user typed (exit status 2); oracle/run.h checks the rest.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "common/config.h"
#include "oracle/run.h"
#include "parallel/comm/comm_backend.h"

namespace touchstone {

struct RunFlags {
  RunOptions run;  // the options CLI11 fills as they are
  std::string backend = "cpu";
  // How the ranks communicate. Not a config key: it changes how the transfers are carried, never what
  // a run computes (both backends give the same bits; docs/communication.md#nccl).
  std::string comm = "mpi";
  std::string fail_at;  // step:rank[:phase]
  // The memory one process may plan to use (plan/run_fit.h); 0: physical memory / processes on the node.
  double memory_limit_gb = 0;
};

// The config of --config (`config_path`, empty: defaults only) with every --set section.key=value
// applied in order. An error in an override names the flag as the user typed it:
// "--set model.x=1: unknown config key 'model.x'".
Config resolve_config_flags(const std::string& config_path, const std::vector<std::string>& set_flags);

// Every flag of a run but --config, --set and --out.
void add_run_flags(CLI::App* command, RunFlags& flags);

// --comm parsed, and whether it can run on this process (NCCL needs the CUDA backend and a GPU).
CommBackend resolve_comm_flag(const RunFlags& flags);

// The run's options from its flags, checked against each other, the resolved config and the number of
// processes: option values, flags that need --checkpoint-dir or exclude one another, the --out and
// --checkpoint-dir paths, and --backend cuda on this process.
RunOptions resolve_run_flags(const RunFlags& flags, const Config& config, int world_size);

}  // namespace touchstone
