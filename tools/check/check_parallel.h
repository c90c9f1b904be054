// `touchstone check parallel`: the layout matrix. Runs the single-rank reference and a list of
// parallel layouts (each parallelism alone first, then combined) as separate jobs, compares the loss,
// every gradient and every updated parameter of each against the reference, and prints one row per
// layout with the worst relative error, the tensor it was in, and pass or fail.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace touchstone {

struct CheckParallelOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::vector<std::string> layouts;     // names; empty: all
  std::string workdir = "check-parallel";
  std::string launcher;                 // empty: "mpirun --oversubscribe" (+ --allow-run-as-root as root)
  double tolerance = 1e-12;
  bool list = false;
};

void add_check_parallel_options(CLI::App* command, CheckParallelOptions& options);

// Returns the exit status: 0 every layout passed, 1 some failed, 2 bad input.
int run_check_parallel(const CheckParallelOptions& options);

}  // namespace touchstone
