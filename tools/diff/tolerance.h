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

#include <optional>
#include <string>

#include "checkpoint/h5_file.h"

namespace touchstone::diff {

struct Tolerance {
  double relative_l2 = 0.0;         // ||candidate - golden|| / ||golden||
  double max_abs_normalized = 0.0;  // max |candidate - golden| / max |golden|, and per element
};

// The FP64 bound: both implementations compute in FP64 and differ only in summation order (about
// 1e-13 for the reductions of a small model, amplified modestly by a few layers and AdamW steps);
// 1e-10 keeps a wide margin while any real bug moves results by 1e-6 or far more.
constexpr double kFp64Tolerance = 1e-10;

class ToleranceModel {
 public:
  // Reads the model from the golden file; throws InputError for malformed JSON or values.
  ToleranceModel(const h5::H5Reader& golden, std::optional<double> override_value);

  // The tolerance for a dataset path such as "steps/1/grads/output_layer.weight"; none when the golden
  // file records none for it. Integer datasets (the loss-token count) must match exactly.
  std::optional<Tolerance> for_path(const std::string& path, bool integer) const;

  const std::string& kind() const { return kind_; }
  const std::string& model_json() const { return json_; }  // as recorded, or the FP64 default
  bool from_file() const { return from_file_; }
  std::optional<double> override_value() const { return override_; }
  // One line for every report, e.g. "fp64 (relative L2 1e-10, max-abs/max|ref| 1e-10)" and the override.
  std::string describe() const;

 private:
  const h5::H5Reader& golden_;
  std::string kind_, json_;
  bool from_file_ = false;
  std::optional<Tolerance> default_;
  std::optional<double> override_;
};

}  // namespace touchstone::diff
