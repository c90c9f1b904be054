// The export command line: options, then one line saying what was written.
#include "tools/export/export_cli.h"

#include <filesystem>

#include "oracle/hf/export.h"
#include "tools/cli/flag_values.h"

namespace touchstone {

void add_export_hf_options(CLI::App* command, ExportHfOptions& options) {
  command->add_option("--golden", options.golden, "Golden file (HDF5) written by `touchstone golden`")
      ->required();
  add_output_directory_option(command, "--out", options.out,
                              "Directory to write config.json and model.safetensors in (created when "
                              "missing; its parent must exist)")
      ->required();
  command
      ->add_option("--step", options.step,
                   "Export the parameters after update S (default 0: the initial parameters, /params/init)")
      ->capture_default_str();
}

int run_export_hf(const ExportHfOptions& options, std::ostream& out) {
  hf::check_export_directory(options.out, "--out");
  const hf::ExportSummary summary = hf::export_hf(options.golden, options.out, options.step);
  const std::filesystem::path dir(options.out);
  out << "wrote " << (dir / "config.json").string() << " and " << (dir / "model.safetensors").string() << " ("
      << summary.tensors << " tensors, " << summary.bytes << " bytes) from " << summary.group << " of "
      << options.golden << std::endl;
  return 0;
}

}  // namespace touchstone
