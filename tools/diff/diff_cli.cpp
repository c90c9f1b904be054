// The diff command line: options, output paths checked before any work, then the three reports.
#include "tools/diff/diff_cli.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>

#include "common/errors.h"
#include "common/text_output.h"
#include "oracle/diff/report.h"
#include "tools/cli/flag_values.h"

namespace touchstone {

namespace {

// --format, --candidate-kind and --step, checked against the candidate's format (detected here when not
// named) so that each error names its flag; load_candidate refuses the same in its own words.
diff::CandidateOptions candidate_options(const DiffOptions& options) {
  static const std::map<std::string, diff::CandidateFormat> kFormats = {
      {"auto", diff::CandidateFormat::kAuto},
      {"golden", diff::CandidateFormat::kGolden},
      {"safetensors", diff::CandidateFormat::kSafetensors},
      {"shards", diff::CandidateFormat::kShards}};
  static const std::map<std::string, diff::CandidateKind> kKinds = {{"grads", diff::CandidateKind::kGrads},
                                                                    {"params", diff::CandidateKind::kParams}};
  const auto format = kFormats.find(options.format);
  if (format == kFormats.end()) throw InputError("--format must be auto, golden, safetensors or shards");
  diff::CandidateOptions candidate;
  candidate.format = format->second;
  candidate.step = options.step;
  if (!options.candidate_kind.empty()) {
    const auto kind = kKinds.find(options.candidate_kind);
    if (kind == kKinds.end()) throw InputError("--candidate-kind must be grads or params");
    candidate.kind = kind->second;
  }
  if (candidate.format == diff::CandidateFormat::kAuto) {
    const std::optional<diff::CandidateFormat> detected = diff::detect_candidate_format(options.candidate);
    if (!detected) {
      throw InputError(options.candidate +
                       ": neither HDF5 nor a .safetensors file; name the format with --format");
    }
    candidate.format = *detected;
  }
  if (candidate.format != diff::CandidateFormat::kSafetensors) {
    if (candidate.kind) {
      throw InputError("--candidate-kind applies to safetensors candidates only (this one is read as " +
                       diff::candidate_format_name(candidate.format) + ")");
    }
    return candidate;
  }
  if (!candidate.kind) {
    throw InputError(options.candidate +
                     ": say what the safetensors tensors are with --candidate-kind grads|params");
  }
  const int64_t step = options.step.value_or(1);
  if (step < (candidate.kind == diff::CandidateKind::kParams ? 0 : 1)) {
    throw InputError("--step " + std::to_string(step) + " is not a step with " + options.candidate_kind);
  }
  return candidate;
}

}  // namespace

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
  add_output_option(command, "--json", options.json_path, "Write every number as JSON");
  add_output_option(command, "--report", options.report_path,
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
  if (options.tolerance && !(std::isfinite(*options.tolerance) && *options.tolerance >= 0)) {
    throw InputError("--tolerance must be a finite number >= 0");
  }
  diff::AnalysisOptions analysis;
  analysis.candidate = candidate_options(options);
  analysis.step = options.step;
  analysis.tolerance = options.tolerance;
  if (options.tp) analysis.tp_sizes = {*options.tp};
  analysis.recompute = !options.no_recompute;
  analysis.allow_partial = options.allow_partial;
  diff::DiffResult result;
  try {
    result = diff::run_analysis(options.golden, options.candidate, analysis);
  } catch (const diff::NoToleranceError& e) {
    throw InputError(std::string(e.what()) + "; give one with --tolerance");
  }
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
