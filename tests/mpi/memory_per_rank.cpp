// Measures the heap peak of every rank of an MPI training run and compares it with the planner's
// prediction for that rank (plan/rank_memory.h). Linked with the allocation tracker, which counts
// every operator new of the process (MPI's and OpenBLAS's malloc are not counted; neither holds model
// data).
//
//   mpirun -np 8 memory_per_rank --config tests/parallel/layout_matrix.json --layout tp2_pp2_dp2 [--markdown]
//   mpirun -np 4 memory_per_rank ... --layout dp4_zero3 --saving-against dp4_zero1
//
// Measured, on each rank: for every step, the heap peak during Trainer::step (the tracker's peak is reset
// as the step starts) minus the live bytes just before the Trainer was constructed; the largest over the
// steps is the rank's peak. It includes everything the Trainer and the step allocate, and what the
// process groups (made with the grid, before the Trainer) allocate during the steps. World rank 0 gathers
// the peaks, prints the table and decides; every rank exits with the same status: 0 when every rank is
// within the margin (memory_layouts.cpp), 1 otherwise, 2 for bad input.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "kernels/backend.h"
#include "oracle/run.h"
#include "oracle/train_step.h"
#include "parallel/comm/context.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/mpi_runtime.h"
#include "plan/alloc_tracker.h"
#include "plan/rank_memory.h"
#include "tests/mpi/memory_layouts.h"

namespace touchstone {
namespace {

// This rank's peak of each step, in bytes above the live bytes before the Trainer existed.
std::vector<int64_t> measure_step_peaks(const PreparedRun& run, Grid& grid) {
  const ParallelContext context = context_of(grid);
  auto backend = make_cpu_backend();
  std::vector<int64_t> peaks;
  peaks.reserve(run.batches.size());  // no allocation of this vector between the steps
  const int64_t before = alloc_tracker::live_bytes();
  Trainer trainer(run.config, run.initial_params, *backend, context);
  for (const GlobalBatch& batch : run.batches) {
    alloc_tracker::reset_peak();
    trainer.step(batch);  // its record (the step's gradients) is freed here, before the next step
    peaks.push_back(alloc_tracker::peak_bytes() - before);
  }
  return peaks;
}

struct Options {
  std::string config_path, layout;
  std::vector<std::string> overrides;
  bool markdown = false;
  std::string saving_against;  // a second layout: the saving per rank, planned against measured
};

// World rank 0: every rank's peaks, steps consecutive per rank.
std::vector<int64_t> gather_peaks(const std::vector<int64_t>& mine, int world_size) {
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(world_size));
  MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
             static_cast<int>(mine.size()), MPI_INT64_T, 0, MPI_COMM_WORLD);
  return all;
}

// One layout measured on every rank; the comparison is world rank 0's (empty elsewhere).
LayoutComparison measure_layout(const std::string& name, const Options& options, const MpiRuntime& mpi) {
  const MemoryLayout& layout = find_memory_layout(name);
  std::vector<std::string> overrides = layout.overrides;
  overrides.insert(overrides.end(), options.overrides.begin(), options.overrides.end());
  const Config config = resolve_config(read_config_file(options.config_path), overrides, options.config_path);
  const PreparedRun run = prepare_run(config, RunOptions{}, mpi.world_size());
  std::vector<int64_t> peaks;
  {
    std::unique_ptr<Grid> grid = Grid::create(grid_layout(config.parallel));
    peaks = measure_step_peaks(run, *grid);
  }
  const std::vector<int64_t> all = gather_peaks(peaks, mpi.world_size());
  if (mpi.world_rank() != 0) return {};
  return compare_layout(layout, config, plan::predict_rank_memory(config), all);
}

int run(const Options& options, const MpiRuntime& mpi) {
  const LayoutComparison comparison = measure_layout(options.layout, options, mpi);
  LayoutComparison baseline;
  if (!options.saving_against.empty()) baseline = measure_layout(options.saving_against, options, mpi);
  int failed = 0;
  if (mpi.world_rank() == 0) {
    print_comparison(comparison, options.markdown, std::cout);
    failed = comparison.failures() > 0 ? 1 : 0;
    if (!options.saving_against.empty()) {
      print_comparison(baseline, options.markdown, std::cout);
      failed |= baseline.failures() > 0 ? 1 : 0;
      failed |= print_saving(baseline, comparison, std::cout) > 0 ? 1 : 0;
    }
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return failed;
}

}  // namespace
}  // namespace touchstone

int main(int argc, char** argv) {
  touchstone::MpiRuntime mpi(&argc, &argv);
  touchstone::Options options;
  CLI::App app("Heap peak of every rank of a training run against the memory planner's prediction");
  app.add_option("--config", options.config_path, "Touchstone JSON config (model, batch)")->required();
  app.add_option("--layout", options.layout, touchstone::memory_layout_help())->required();
  app.add_option("--set", options.overrides, "Override one config key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--saving-against", options.saving_against,
                 "Also measure this layout and check each rank's saving against the planned one");
  app.add_flag("--markdown", options.markdown, "Print the table as Markdown (docs/BENCHMARKS.md)");
  try {
    app.parse(argc, argv);
    return touchstone::run(options, mpi);
  } catch (const CLI::ParseError& e) {
    return mpi.world_rank() == 0 ? app.exit(e) : e.get_exit_code();
  } catch (const touchstone::InputError& e) {
    if (mpi.world_rank() == 0) std::cerr << "memory_per_rank: " << e.what() << "\n";
    return 2;
  }
}
