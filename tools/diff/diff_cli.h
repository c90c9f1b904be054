// `touchstone diff GOLDEN CANDIDATE`: the command line of the diff (tools/diff/diff.h does the work).
// Runs without MPI. Exit status: 0 every compared tensor passes, 1 some fail, 2 bad input.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace touchstone {

struct DiffOptions {
  std::string golden;
  std::string candidate;
  std::string format = "auto";
  std::string candidate_kind;
  std::optional<int64_t> step;
  std::optional<double> tolerance;
  std::optional<int> tp;
  std::string json_path;
  std::string report_path;
  bool no_recompute = false;
};

void add_diff_options(CLI::App* command, DiffOptions& options);

int run_diff(const DiffOptions& options);

}  // namespace touchstone
