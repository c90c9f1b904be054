// `touchstone diff GOLDEN CANDIDATE`: the command line of the diff (oracle/diff/diff.h does the work).
// Runs without MPI. Exit status: 0 every compared tensor passes, 1 some fail (or the candidate holds only
// part of a group it records, without --allow-partial), 2 bad input.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace touchstone {

struct DiffOptions {
  std::string golden;
  std::string candidate;
  std::string format = "auto";      // auto | golden | safetensors | shards
  std::string candidate_kind;       // safetensors: grads | params
  std::optional<int64_t> step;      // one step only; 0: the initial parameters
  std::optional<double> tolerance;  // overrides the golden file's tolerances (reported as such)
  std::optional<int> tp;            // tensor-parallel size for the one-shard signature
  std::string json_path;
  std::string report_path;
  bool no_recompute = false;   // judge against the trajectory; skip the signatures that re-evaluate a step
  bool allow_partial = false;  // a candidate holding part of a group may pass
};

void add_diff_options(CLI::App* command, DiffOptions& options);

int run_diff(const DiffOptions& options);

}  // namespace touchstone
