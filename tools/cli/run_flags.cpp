// The flags of a run, and the checks that concern them alone (tools/cli/run_flags.h).
#include "tools/cli/run_flags.h"

#include <filesystem>
#include <system_error>

#include "common/errors.h"
#include "common/text_output.h"
#include "tools/cli/flag_values.h"

namespace touchstone {

Config resolve_config_flags(const std::string& config_path, const std::vector<std::string>& set_flags) {
  // Reading a directory as a stream fails deep in the standard library, with no name of the flag. The
  // overload with an error code: a name too long for the file system is bad input, not an exception.
  std::error_code error;
  if (!config_path.empty() && std::filesystem::is_directory(config_path, error)) {
    throw InputError("--config " + config_path + ": is a directory, not a config file");
  }
  if (error && error != std::errc::no_such_file_or_directory) {
    throw InputError("--config " + config_path + ": " + error.message());
  }
  const nlohmann::json file = config_path.empty() ? nlohmann::json() : read_config_file(config_path);
  try {
    return resolve_config(file, set_flags, config_path.empty() ? "config" : config_path);
  } catch (const InputError& e) {
    // The library begins an override's errors with "override 'ASSIGNMENT': " (common/config.cpp).
    const std::string message = e.what();
    for (const std::string& assignment : set_flags) {
      const std::string library_origin = "override '" + assignment + "': ";
      if (message.starts_with(library_origin)) {
        throw InputError("--set " + assignment + ": " + message.substr(library_origin.size()));
      }
    }
    throw;
  }
}

void add_run_flags(CLI::App* command, RunFlags& flags) {
  RunOptions& options = flags.run;
  command->add_option("--init-from", options.init_from,
                      "Load initial parameters from an HDF5 file (a golden file) instead of drawing them");
  command->add_option("--init-group", options.init_group, "Group of --init-from holding the tensors")
      ->capture_default_str();
  command->add_flag("--save-optimizer-state", options.golden.save_optimizer_state,
                    "Also record the AdamW moments after every step in the golden file");
  command->add_flag("--trace", options.trace,
                    "Print every collective and point-to-point transfer of every rank, and the pipeline "
                    "timeline of every step");
  command
      ->add_option("--backend", flags.backend,
                   "Kernels: cpu (the reference, default) or cuda (one GPU per rank; docs/cuda.md)")
      ->capture_default_str();
  add_output_option(command, "--timeline", options.timeline_svg,
                    "Write the last step's pipeline timeline as SVG");
  command->add_flag(
      "--envelope", options.envelope,
      "Run the configured precision (bf16 or fp32) and FP64 from the same weights; write the FP64 "
      "golden values with the low-precision error and tolerance of every tensor");
  CheckpointOptions& c = options.checkpoint;
  add_output_directory_option(
      command, "--checkpoint-dir", c.directory,
      "Directory of checkpoints, the latest-complete record and the sample ledger (docs/checkpoints.md)");
  command->add_option("--save-every", c.save_every,
                      "Save a checkpoint after every N updates (the last is always saved)");
  command->add_option("--keep", c.keep, "Complete checkpoints to keep (0: all)")->capture_default_str();
  command->add_flag(
      "--resume", c.resume,
      "Continue from the latest complete checkpoint of --checkpoint-dir (a fresh start if there is none)");
  command->add_flag(
      "--fallback", c.fallback,
      "With --resume: if the latest checkpoint is refused, continue from the newest older one that verifies");
  command->add_option(
      "--fail-at", flags.fail_at,
      "step:rank[:phase] - that world rank dies abruptly (SIGKILL) in phase forward (default), "
      "backward, optimizer or save of that update; fires once per checkpoint directory");
  command->add_option("--memory-limit-gb", flags.memory_limit_gb,
                      "Memory one process may plan to use, in GB (default: physical memory / processes "
                      "on this node); a run planned above it is refused before it allocates");
  command
      ->add_option("--comm", flags.comm,
                   "Communication backend: mpi, or nccl (CUDA builds, one GPU per rank; same results)")
      ->capture_default_str();
}

CommBackend resolve_comm_flag(const RunFlags& flags) {
  const CommBackend comm = parse_comm_backend(flags.comm);
  naming_flag("--comm " + flags.comm, [&] { check_comm_available(comm); });
  return comm;
}

namespace {

void check_checkpoint_flags(const RunOptions& options) {
  const CheckpointOptions& c = options.checkpoint;
  if (c.save_every < 0) throw InputError("--save-every must be >= 0");
  if (c.keep < 0) throw InputError("--keep must be >= 0");
  if (c.directory.empty()) {
    if (c.resume || c.fallback || c.save_every > 0) {
      throw InputError("--resume, --fallback and --save-every need --checkpoint-dir");
    }
    return;
  }
  if (options.envelope)
    throw InputError("--envelope runs twice from the same weights: it takes no --checkpoint-dir");
  check_output_directory(c.directory, "--checkpoint-dir");
  if (c.resume && !options.golden_path.empty()) {
    throw InputError(
        "--out records a whole run from its initial weights; it cannot be combined with --resume");
  }
}

}  // namespace

RunOptions resolve_run_flags(const RunFlags& flags, const Config& config, int world_size) {
  RunOptions options = flags.run;
  if (!options.golden_path.empty()) check_output_path(options.golden_path, "--out");
  if (!options.timeline_svg.empty()) check_output_path(options.timeline_svg, "--timeline");
  options.backend = parse_backend_kind(flags.backend);
  // Whether a GPU is usable may differ between ranks; the caller has the ranks agree on the outcome.
  naming_flag("--backend " + flags.backend, [&] { check_backend_available(options.backend); });
  if (options.envelope && config.precision == Precision::kFp64) {
    throw InputError("--envelope measures a lower precision against FP64: set precision to bf16 or fp32");
  }
  if (!flags.fail_at.empty()) {
    const ProcessFault fault = parse_process_fault(flags.fail_at);
    if (fault.rank >= world_size) {
      throw InputError("--fail-at " + flags.fail_at + ": rank is not below the world size " +
                       std::to_string(world_size));
    }
    options.checkpoint.fail_at = fault;
  }
  check_checkpoint_flags(options);
  return options;
}

}  // namespace touchstone
