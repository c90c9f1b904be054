// The diff command line: options, output paths checked before any work, then the three reports.
#include "tools/diff/diff_cli.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "common/errors.h"
#include "common/text_output.h"
#include "oracle/diff/report.h"

namespace touchstone {

void add_diff_options(CLI::App* command, DiffOptions& options) {
  command->add_option("golden", options.golden, "Golden file (HDF5) written by `touchstone golden`")
      ->required();
  command
      ->add_option("candidate", options.candidate,
                   "What to check: an HDF5 file in the golden schema, a .safetensors file or directory, or a "
                   "directory of per-rank shards with shards.json (see docs/diffing.md)")
      ->required();
  command->add_option(
      "--step", options.step,
      "Compare this step only (default: every step the candidate holds; 0: the initial parameters)");
  command->add_option("--format", options.format, "Candidate format (default: detected)")
      ->check(CLI::IsMember({"auto", "golden", "safetensors", "shards"}))
      ->capture_default_str();
  command
      ->add_option("--candidate-kind", options.candidate_kind,
                   "What a safetensors candidate holds: the gradients of --step, or the parameters after it")
      ->check(CLI::IsMember({"grads", "params"}));
  command->add_option(
      "--tolerance", options.tolerance,
      "Override every tolerance (relative L2 and max-abs/max|golden|); reported as an override");
  command
      ->add_option("--tp", options.tp,
                   "Tensor-parallel size to test the one-shard signature with (default 2, 4, 8)")
      ->check(CLI::Range(1, 4096));
  command->add_option("--json", options.json_path, "Write every number as JSON");
  command->add_option("--report", options.report_path,
                      "Write a self-contained HTML report with error charts");
  command->add_flag(
      "--no-recompute", options.no_recompute,
      "Judge every step against the golden trajectory and skip the signatures that re-evaluate a "
      "step (re-anchoring, other normalisation, masks, QKV grouping)");
  command->add_flag(
      "--allow-partial", options.allow_partial,
      "Accept a candidate that holds only some tensors of a group (exit 0 when what it holds passes)");
}

int run_diff(const DiffOptions& options) {
  if (!options.json_path.empty()) check_output_path(options.json_path, "--json");
  if (!options.report_path.empty()) check_output_path(options.report_path, "--report");
  diff::AnalysisOptions analysis;
  analysis.candidate.format = options.format;
  analysis.candidate.kind = options.candidate_kind;
  analysis.candidate.step = options.step;
  analysis.step = options.step;
  analysis.tolerance = options.tolerance;
  if (options.tp) analysis.tp_sizes = {*options.tp};
  analysis.recompute = !options.no_recompute;
  analysis.allow_partial = options.allow_partial;
  const diff::DiffResult result = diff::run_analysis(options.golden, options.candidate, analysis);
  const bool colour = isatty(STDOUT_FILENO) != 0 && std::getenv("NO_COLOR") == nullptr;
  diff::print_table(result, std::cout, colour);
  if (!options.json_path.empty())
    write_text_file_atomically(options.json_path, diff::to_json(result).dump(2) + "\n");
  if (!options.report_path.empty())
    write_text_file_atomically(options.report_path, diff::html_report(result));
  std::cout.flush();
  return result.exit_status();
}

}  // namespace touchstone
