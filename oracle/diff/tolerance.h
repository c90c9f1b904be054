// Per-tensor tolerances of a golden file: the root attribute `tolerance_model` (JSON), per-tensor
// overrides under /envelope/tolerance/<path>, and an optional command-line override.
//
// tolerance_model: {"kind": "fp64", "relative_l2": 1e-10} for FP64 golden files. Keys: "kind" (a
// name, shown in reports), "relative_l2" (the default for every dataset; optional: an envelope model
// such as {"kind": "envelope", ...} has none), "max_abs_normalized" (optional, defaults to
// relative_l2). /envelope/tolerance/<path> is float64 [2]: {relative-L2 tolerance, max-abs error
// normalised by max|golden| tolerance} for the recorded dataset <path> and overrides the default. A
// dataset with neither has no tolerance and is not compared (unless --tolerance is given). A golden
// file without the attribute is read with the FP64 model. docs/diffing.md describes both.
#pragma once

#include <array>
#include <optional>
#include <string>

#include "common/h5_file.h"
#include "common/options.h"

namespace touchstone::diff {

struct Tolerance {
  double relative_l2 = 0.0;         // ||candidate - golden|| / ||golden||
  double max_abs_normalized = 0.0;  // max |candidate - golden| / max |golden|, and per element
};

// The FP64 bound: both implementations compute in FP64 and differ only in summation order (about
// 1e-13 for the reductions of a small model, amplified modestly by a few layers and AdamW steps);
// 1e-10 keeps a wide margin while any real bug moves results by 1e-6 or far more.
constexpr double kFp64Tolerance = 1e-10;

// A golden file with a precision envelope (`touchstone golden --envelope`): the low precision it
// measured and how its tolerances are derived from the measured error (k x error + floor).
struct EnvelopeModel {
  Precision precision = Precision::kBf16;  // bf16 or fp32
  bool grad_accumulation_fusion = true;
  double k = 4.0, floor = 1e-6;

  // The tolerance of a dataset whose low-precision error is `error` ({relative L2, max-abs/max|ref|}).
  Tolerance tolerance(const std::array<double, 2>& error) const {
    return Tolerance{k * error[0] + floor, k * error[1] + floor};
  }
};

class ToleranceModel {
 public:
  // Reads the model from the golden file; throws InputError for malformed JSON or values.
  ToleranceModel(const h5::H5Reader& golden, std::optional<double> override_value);

  // The tolerance for a dataset path such as "steps/1/grads/output_layer.weight"; none when the golden
  // file records none for it. Integer datasets (the loss-token count) must match exactly.
  std::optional<Tolerance> for_path(const std::string& path, bool integer) const;

  const std::string& kind() const { return kind_; }
  // The envelope's parameters when the kind is "envelope" and it names its precision.
  const std::optional<EnvelopeModel>& envelope() const { return envelope_; }
  // Whether a step can be judged at other parameters: not for an envelope that names no precision
  // (its tolerances hold at the golden parameters only).
  bool reanchorable() const { return kind_ != "envelope" || envelope_.has_value(); }
  // The precision of the master weights and the optimizer of the run the golden file describes: fp64
  // for an FP64 file, the envelope's precision for an envelope file, else the file's precision.
  Precision master_precision() const { return master_precision_; }
  const std::string& model_json() const { return json_; }  // as recorded, or the FP64 default
  std::optional<double> override_value() const { return override_; }
  // One line for every report, e.g. "fp64 (relative L2 1e-10, max-abs/max|ref| 1e-10)" and the override.
  std::string describe() const;

 private:
  const h5::H5Reader& golden_;
  std::string kind_, json_;
  bool from_file_ = false;
  std::optional<Tolerance> default_;
  std::optional<double> override_;
  std::optional<EnvelopeModel> envelope_;
  Precision master_precision_ = Precision::kFp64;
};

}  // namespace touchstone::diff
