// The `touchstone` command line: one binary, one subcommand per job.
//
// Exit status: 0 success, 2 bad input (config, data, files; reported before any compute and without
// leaving an output file) and outputs that cannot be written (docs/config.md#outputs), 128 + signal
// after SIGINT or SIGTERM (common/signals.h), 1 anything else.
#include <CLI/CLI.hpp>
#include <iostream>
#include <utility>

#include "common/config.h"
#include "common/errors.h"
#include "common/signals.h"
#include "common/version.h"
#include "kernels/cpu/parallel_for.h"
#include "oracle/run.h"
#include "parallel/comm/comm_backend.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/mpi_runtime.h"
#include "plan/run_fit.h"
#include "tools/check/check_parallel.h"
#include "tools/cli/flag_values.h"
#include "tools/cli/run_flags.h"
#include "tools/commbench/commbench.h"
#include "tools/diff/diff_cli.h"
#include "tools/export/export_cli.h"
#include "tools/ledger/ledger_cli.h"
#include "tools/plan/plan_cli.h"
#include "tools/supervise/supervise_cli.h"

namespace {

using touchstone::InputError;

// " plan memory": the subcommands the parser reached below `app`, for the pointer to the deepest one's
// --help.
std::string parsed_subcommands(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    if (sub->parsed()) return " " + sub->get_name() + parsed_subcommands(*sub);
  }
  return "";
}

// The deepest subcommand the parser reached (`app` itself when none).
const CLI::App& deepest_parsed(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    if (sub->parsed()) return deepest_parsed(*sub);
  }
  return app;
}

// A parse error (an unknown flag, a missing value, a value CLI11 cannot convert) in the one-line form
// of every other refusal: CLI11's own exit() prints the message and a second line on --help.
int report_parse_error(const CLI::App& app, const CLI::ParseError& e) {
  std::string message = e.what();
  for (char& c : message) {
    if (c == '\n') c = ' ';
  }
  while (!message.empty() && message.back() == ' ') message.pop_back();
  // CLI11 says "A subcommand is required" for `touchstone frobnicate`: name the word instead.
  const std::vector<std::string> left = deepest_parsed(app).remaining();
  if (!left.empty() && message.rfind("A subcommand is required", 0) == 0) {
    message = "unknown command '" + left.front() + "'";
  }
  std::cerr << "touchstone: error: " << message << " (see touchstone" << parsed_subcommands(app) << " --help)"
            << std::endl;
  return 2;
}

struct ConfigOptions {
  std::string config_path;
  std::vector<std::string> overrides;
};

void add_config_options(CLI::App* command, ConfigOptions& options) {
  command->add_option("--config", options.config_path,
                      "JSON config file (every key has a default; see docs/config.md)");
  command
      ->add_option("--set", options.overrides,
                   "Override one config key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
}

touchstone::Config resolve(const ConfigOptions& options) {
  return touchstone::resolve_config_flags(options.config_path, options.overrides);
}

// Every rank validates the same inputs; they agree on the outcome before any communicator is built,
// so a bad input ends every rank with status 2 (the message printed once, by rank 0) and none waits
// in a collective for a rank that has already left.
int run(const ConfigOptions& config_options, const touchstone::RunFlags& run_flags,
        touchstone::MpiRuntime& mpi) {
  std::string error;
  touchstone::PreparedRun prepared;
  touchstone::RunOptions run_options;
  touchstone::CommBackend comm = touchstone::CommBackend::kMpi;
  try {
    comm = touchstone::resolve_comm_flag(run_flags);
    const touchstone::Config config = resolve(config_options);
    run_options = touchstone::resolve_run_flags(run_flags, config, mpi.world_size());
    const auto budget = touchstone::naming_flag("--memory-limit-gb", [&] {
      return touchstone::plan::memory_budget(mpi.world_size(), run_flags.memory_limit_gb);
    });
    touchstone::plan::check_run_fits(
        config,
        {!run_options.golden_path.empty(), run_options.golden.save_optimizer_state, run_options.envelope,
         !run_options.checkpoint.directory.empty()},
        mpi.world_size(), budget);
    prepared = touchstone::prepare_run(config, run_options, mpi.world_size());
  } catch (const InputError& e) {
    error = e.what();
  }
  const int failed_ranks = mpi.sum_over_world(error.empty() ? 0 : 1);
  if (failed_ranks > 0) {
    if (mpi.world_rank() == 0) {
      std::cerr << "touchstone: error: " << (error.empty() ? "input rejected on another rank" : error)
                << std::endl;
    }
    return 2;
  }
  const touchstone::Config& c = prepared.config;
  const touchstone::GridLayout layout = touchstone::grid_layout(c.parallel);
  // NCCL groups refuse two ranks on one GPU; the user asked for them with --comm nccl.
  const auto create_grid = [&] { return touchstone::Grid::create(layout, comm); };
  auto grid = comm == touchstone::CommBackend::kNccl ? touchstone::naming_flag("--comm nccl", create_grid)
                                                     : create_grid();
  touchstone::execute_run(std::move(prepared), run_options, *grid, std::cout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any other thread starts: OpenBLAS's idle workers sleep instead of spinning beside the kernels.
  touchstone::cpu::let_blas_threads_sleep();
  // Before anything is written: an interrupted command removes its temporaries (one policy for all).
  touchstone::install_signal_cleanup();
  CLI::App app{"Touchstone: a reference trainer whose golden files production runs are diffed against"};
  app.set_version_flag("--version", touchstone::generator_string());
  app.require_subcommand(1);

  ConfigOptions config_options;
  touchstone::RunFlags run_flags;

  CLI::App* golden = app.add_subcommand("golden",
                                        "Train train.steps steps and write a golden file (loss, "
                                        "loss-token counts, gradients, updated parameters)");
  add_config_options(golden, config_options);
  touchstone::add_run_flags(golden, run_flags);
  touchstone::add_output_option(golden, "--out", run_flags.run.golden_path, "Golden file to write (HDF5)")
      ->required();

  CLI::App* train = app.add_subcommand("train", "Train train.steps steps, printing the loss of every step");
  add_config_options(train, config_options);
  touchstone::add_run_flags(train, run_flags);
  touchstone::add_output_option(train, "--out", run_flags.run.golden_path, "Also write a golden file (HDF5)");

  CLI::App* show =
      app.add_subcommand("config", "Print the fully resolved config as JSON (defaults included)");
  add_config_options(show, config_options);

  CLI::App* check = app.add_subcommand("check", "Correctness checks across layouts");
  check->require_subcommand(1);
  touchstone::CheckParallelOptions check_parallel_options;
  CLI::App* check_parallel = check->add_subcommand(
      "parallel",
      "Run the single-rank reference and every parallel layout, compare loss, gradients and updates");
  touchstone::add_check_parallel_options(check_parallel, check_parallel_options);

  touchstone::CommbenchOptions commbench_options;
  CLI::App* commbench = app.add_subcommand(
      "commbench", "Check and time every collective over a sweep of message sizes (nccl-tests style)");
  touchstone::add_commbench_options(commbench, commbench_options);

  touchstone::DiffOptions diff_options;
  CLI::App* diff = app.add_subcommand(
      "diff",
      "Compare another trainer's loss, gradients and parameters with a golden file, tensor by tensor");
  touchstone::add_diff_options(diff, diff_options);

  CLI::App* export_command =
      app.add_subcommand("export", "Write a golden file's parameters for another framework");
  export_command->require_subcommand(1);
  touchstone::ExportHfOptions export_hf_options;
  CLI::App* export_hf = export_command->add_subcommand(
      "hf", "Write config.json and model.safetensors that Hugging Face's LlamaForCausalLM loads");
  touchstone::add_export_hf_options(export_hf, export_hf_options);

  const std::unique_ptr<touchstone::plan::PlanCommand> plan = touchstone::plan::add_plan_commands(app);
  const std::unique_ptr<touchstone::ledger::LedgerCommand> ledger =
      touchstone::ledger::add_ledger_command(app);
  const std::unique_ptr<touchstone::supervise::SuperviseCommand> supervise =
      touchstone::supervise::add_supervise_command(app);

  touchstone::check_integer_flags(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return report_parse_error(app, e);
  } catch (const InputError& e) {  // a flag's value refused while parsing (an empty output path)
    std::cerr << "touchstone: error: " << e.what() << std::endl;
    return 2;
  }

  try {
    if (show->parsed()) {
      const touchstone::Config config = resolve(config_options);
      touchstone::validate_config(config, 1);
      std::cout << touchstone::to_json(config).dump(2) << std::endl;
      return 0;
    }
    if (plan->parsed()) return plan->run(std::cout);  // arithmetic only: no MPI
    // Launches its own MPI jobs, so it must not be an MPI process itself.
    if (check_parallel->parsed()) return touchstone::run_check_parallel(check_parallel_options);
    if (diff->parsed()) return touchstone::run_diff(diff_options);  // reads files only: no MPI
    if (ledger->parsed()) return ledger->run(std::cout);            // reads files only: no MPI
    // Reads a golden file and writes a directory: no MPI.
    if (export_hf->parsed()) return touchstone::run_export_hf(export_hf_options, std::cout);
    // Launches the job's MPI processes, so it must not be an MPI process itself.
    if (supervise->parsed()) return supervise->run();
  } catch (const InputError& e) {
    std::cerr << "touchstone: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "touchstone: internal error: " << e.what() << std::endl;
    return 1;
  }

  touchstone::MpiRuntime mpi(&argc, &argv);
  try {
    if (commbench->parsed()) return touchstone::run_commbench(commbench_options, mpi);
    return run(config_options, run_flags, mpi);
  } catch (const InputError& e) {
    std::cerr << "touchstone: error: " << e.what() << std::endl;
    if (mpi.world_size() > 1) mpi.abort(2);
    return 2;
  } catch (const std::exception& e) {
    // A failure on one rank only: end the whole job rather than leave the others waiting.
    std::cerr << "touchstone: internal error on rank " << mpi.world_rank() << ": " << e.what() << std::endl;
    if (mpi.world_size() > 1) mpi.abort(1);
    return 1;
  }
}
