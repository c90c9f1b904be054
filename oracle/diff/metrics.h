// Per-tensor error metrics of a candidate against a reference tensor, and the pass rule.
//
// Errors are normalised by the reference tensor as a whole (its L2 norm, its largest magnitude), never
// element by element, so that cancellation in small elements does not count as error. Cosine
// similarity is reported but not used to decide: 1 - cos only grows like the square of the error.
//
// Some elements have a bound of their own instead (ElementBounds): the optimizer check bounds every
// updated parameter by the rounding of the update formula, and elements whose gradient lies within the
// precision's noise of zero get the bound Adam's step size allows (docs/precision.md). Those elements
// are judged by |c - g| <= bound alone and left out of the tensor-wide relative-L2 and max-abs rule.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "oracle/diff/tolerance.h"
#include "oracle/golden/recorded.h"

namespace touchstone::diff {

struct TensorMetrics {
  int64_t numel = 0;
  double max_abs_error = 0.0;        // max |c - g|
  double max_abs_golden = 0.0;       // max |g|
  double max_abs_normalized = 0.0;   // max |c - g| / max |g| (max |c - g| when g is all zeros)
  double relative_l2 = 0.0;          // ||c - g|| / ||g|| (||c - g|| when g is all zeros)
  double cosine = 1.0;               // c.g / (||c|| ||g||); 1 when both are zero, 0 when one is
  int64_t over_tolerance = 0;        // elements with |c - g| > tol.max_abs_normalized * max |g|
  std::vector<int64_t> worst_index;  // multi-index of the largest |c - g| (empty for a scalar)
  double worst_golden = 0.0, worst_candidate = 0.0;
  bool has_ulp = false;    // both sides in the same floating-point type (float64, float32, bfloat16, float16)
  uint64_t max_ulp = 0;    // the largest distance in units in the last place of that type
  int64_t non_finite = 0;  // NaN or infinite candidate elements (they fail the tensor)
  std::vector<int64_t> first_non_finite;
  // With element bounds: how many elements have one, and the largest |c - g| / bound among them.
  int64_t bounded = 0;
  double worst_bound_ratio = 0.0;
  // The tensor-wide rule on the elements without a bound of their own (all elements without bounds).
  double rule_relative_l2 = 0.0, rule_max_abs_normalized = 0.0;
  // How far from its tolerance the tensor is: the largest of rule_relative_l2 / tol.relative_l2,
  // rule_max_abs_normalized / tol.max_abs_normalized and worst_bound_ratio (<= 1 passes; a failure
  // 10x outside its tolerance reads 10).
  double tolerance_ratio = 0.0;
};

// A bound of its own for some elements: |c - g| <= bound[i] for every i with a finite bound[i]; NaN
// (kNoElementBound) for the elements the tensor-wide rule judges.
using ElementBounds = std::vector<double>;
constexpr double kNoElementBound = std::numeric_limits<double>::quiet_NaN();

// Compares tensors of the same shape (the caller checks shapes) against `tol` and, when given, the
// elements' own bounds (same length as the tensor).
TensorMetrics compare_values(const Recorded& golden, const Recorded& candidate, const Tolerance& tol,
                             const ElementBounds* bounds = nullptr);

// `tol` must be the tolerance the metrics were computed with (it sets over_tolerance).
bool passes(const TensorMetrics& metrics, const Tolerance& tol);

// Distance in representable values of `type` ("float64", "float32", "bfloat16" or "float16") between
// two values stored in it (a 16-bit copy and the reference rounded to its type, stored_copy.h).
uint64_t ulp_distance(double a, double b, const std::string& type);

// Two Touchstone golden files of the same run compared dataset by dataset over every recorded step
// (`touchstone check parallel` in FP64): the dataset with the largest relative L2 error of `candidate`
// against `reference`. A step or dataset missing, another shape, a non-finite value or a file that is
// not a golden file gives relative_l2 = infinity with `path` saying what.
struct FileDifference {
  std::string path;          // e.g. "steps/2/grads/output_layer.weight"
  double relative_l2 = 0.0;  // ||candidate - reference|| / ||reference||
};
FileDifference worst_step_difference(const std::string& candidate, const std::string& reference);

// Row-major flat index -> multi-index.
std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape);

}  // namespace touchstone::diff
