// touchstone diff: a candidate (another trainer's loss, gradients and parameters after the same steps
// on the same batches from the same initial weights) compared with a golden file tensor by tensor, in
// data-flow order, with the first failing tensor and the error signatures that match (verdicts).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "oracle/diff/candidate.h"
#include "oracle/diff/judge.h"
#include "oracle/diff/metrics.h"
#include "oracle/diff/tolerance.h"

namespace touchstone::diff {

enum class Status { kPass, kFail, kNotCompared };

// One dataset of the golden schema, in the order the diff walks them.
struct Entry {
  std::string path;    // "steps/1/grads/output_layer.weight"
  int64_t step = 0;    // 0 for the initial parameters
  std::string group;   // "init", "loss", "num_loss_tokens", "token_losses", "grads", "grad_norm", "lr",
                       // "params", "exp_avg", "exp_avg_sq"
  std::string name;    // the parameter name, or the group for a scalar
  int param = -1;      // parameter table id; -1 for datasets that are not parameters
  int64_t layer = -1;  // decoder layer of the parameter; -1 outside the layers
  std::string kind;    // kind_name() of the parameter; empty for other datasets
  bool integer = false;
  Status status = Status::kNotCompared;
  std::string reason;  // why it failed or was not compared (empty when metrics decide)
  Tolerance tolerance;
  TensorMetrics metrics;
  // What decided (judge.h): re-anchored at the candidate's parameters, the optimizer check, or the
  // golden trajectory. Under the first two the candidate against the golden file's own value and
  // tolerance is kept as information and decides nothing.
  Basis basis = Basis::kTrajectory;
  std::optional<TensorMetrics> trajectory;
  bool trajectory_passes = true;
};

// The values an entry was judged against (re-anchored, optimizer check or the golden file).
inline Recorded reference_of(Judge& judge, const Entry& e) {
  return judge.judge(e.path, e.group, e.param, e.step).reference;
}

struct Verdict {
  std::string
      signature;        // "loss_normalization", "token_count", "gradient_scale", "one_layer", "tp_shard", ...
  std::string message;  // one line for the reports
};

// What run_analysis throws when the golden file records no tolerance for anything the candidate holds:
// only a tolerance override (AnalysisOptions::tolerance) can compare it, which a command line may say.
class NoToleranceError : public InputError {
 public:
  using InputError::InputError;
};

struct AnalysisOptions {
  CandidateOptions candidate;
  std::optional<int64_t> step;      // only this step (0: the initial parameters)
  std::optional<double> tolerance;  // command-line override of every tolerance
  std::vector<int> tp_sizes;        // tensor-parallel sizes to test the one-shard signature with
  bool recompute = true;            // re-anchor steps and evaluate the golden batch under other rules
  bool allow_partial = false;       // a candidate missing tensors of a group it holds may still pass
};

struct DiffResult {
  std::string golden_path, candidate_path, candidate_format, candidate_generator, golden_precision;
  std::string tolerance_kind, tolerance_model, tolerance_text;
  std::optional<double> tolerance_override;
  int64_t num_layers = 0;
  std::vector<Entry> entries;  // data-flow order, steps ascending
  int first_failure = -1;      // index into entries
  std::vector<Verdict> verdicts;
  std::vector<std::string> notes;
  // How the steps were judged, one line for every report (re-anchored, or the trajectory and why).
  std::string judgment;
  double recompute_seconds = 0.0;  // evaluating re-anchored steps
  // Groups the candidate holds only part of: "steps/1/params: 33 of 34 tensors missing (...)". Such a
  // candidate fails unless allow_partial (exit status 1), since what it left out was never checked.
  std::vector<std::string> partial;
  bool allow_partial = false;
  // Copies the candidate holds more than once that differ (Candidate::replica_disagreements): exit status 1.
  std::vector<std::string> replicas_disagree;

  int count(Status status) const;
  bool refused_as_partial() const { return !partial.empty() && !allow_partial; }
  int exit_status() const {
    return count(Status::kFail) > 0 || refused_as_partial() || !replicas_disagree.empty() ? 1 : 0;
  }
  double worst_tolerance_ratio(int64_t step, const std::string& group) const;  // 0 when none compared
};

// Throws InputError for unreadable or inconsistent inputs, or a candidate with nothing to compare.
DiffResult run_analysis(const std::string& golden_path, const std::string& candidate_path,
                        const AnalysisOptions& options);

// The parameter table ids in data-flow order of the backward pass: output layer, final norm, layers
// L-1 .. 0 (fc2, fc1, pre-MLP norm, proj, qkv, input norm), embedding.
std::vector<int> params_in_flow_order(const ParamTable& table);

// Short names for charts and tables: "qkv", "fc1", "embedding", ...
std::string kind_name(ParamKind kind);

}  // namespace touchstone::diff
