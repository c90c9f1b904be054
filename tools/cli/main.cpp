// The `touchstone` command line: one binary, one subcommand per job.
//
// Exit status: 0 success, 2 bad input (config, data, files; reported before any compute and without
// leaving an output file), 1 anything else.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>

#include "model/config.h"
#include "model/errors.h"
#include "oracle/run.h"

namespace {

using touchstone::InputError;

struct ConfigOptions {
  std::string config_path;
  std::vector<std::string> overrides;
};

void add_config_options(CLI::App* command, ConfigOptions& options) {
  command->add_option("--config", options.config_path, "JSON config file (every key has a default; see docs/config.md)");
  command->add_option("--set", options.overrides, "Override one config key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
}

void add_run_options(CLI::App* command, touchstone::RunOptions& options) {
  command->add_option("--init-from", options.init_from,
                      "Load initial parameters from an HDF5 file (a golden file) instead of drawing them");
  command->add_option("--init-group", options.init_group, "Group of --init-from holding the tensors")
      ->capture_default_str();
  command->add_flag("--save-optimizer-state", options.golden.save_optimizer_state,
                    "Also record the AdamW moments after every step in the golden file");
}

touchstone::Config resolve(const ConfigOptions& options) {
  const nlohmann::json file_json =
      options.config_path.empty() ? nlohmann::json() : touchstone::read_config_file(options.config_path);
  return touchstone::resolve_config(file_json, options.overrides,
                                    options.config_path.empty() ? "config" : options.config_path);
}

void check_output_path(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(parent)) {
    throw InputError(path + ": output directory " + parent.string() + " does not exist");
  }
  if (std::filesystem::is_directory(path)) throw InputError(path + ": is a directory");
}

int run(const ConfigOptions& config_options, touchstone::RunOptions& run_options) {
  const touchstone::Config config = resolve(config_options);
  if (!run_options.golden_path.empty()) check_output_path(run_options.golden_path);
  const touchstone::PreparedRun prepared = touchstone::prepare_run(config, run_options);
  touchstone::execute_run(prepared, run_options, std::cout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Touchstone: a reference trainer whose golden files production runs are diffed against"};
  app.set_version_flag("--version", std::string("touchstone ") + TOUCHSTONE_VERSION + " (" + TOUCHSTONE_GIT_COMMIT + ")");
  app.require_subcommand(1);

  ConfigOptions config_options;
  touchstone::RunOptions run_options;

  CLI::App* golden = app.add_subcommand("golden", "Train train.steps steps and write a golden file (loss, "
                                                  "loss-token counts, gradients, updated parameters)");
  add_config_options(golden, config_options);
  add_run_options(golden, run_options);
  golden->add_option("--out", run_options.golden_path, "Golden file to write (HDF5)")->required();

  CLI::App* train = app.add_subcommand("train", "Train train.steps steps, printing the loss of every step");
  add_config_options(train, config_options);
  add_run_options(train, run_options);
  train->add_option("--out", run_options.golden_path, "Also write a golden file (HDF5)");

  CLI::App* show = app.add_subcommand("config", "Print the fully resolved config as JSON (defaults included)");
  add_config_options(show, config_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  try {
    if (show->parsed()) {
      const touchstone::Config config = resolve(config_options);
      touchstone::validate_config(config, 1);
      std::cout << touchstone::to_json(config).dump(2) << std::endl;
      return 0;
    }
    return run(config_options, run_options);
  } catch (const InputError& e) {
    std::cerr << "touchstone: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "touchstone: internal error: " << e.what() << std::endl;
    return 1;
  }
}
