// 16-bit parameter copies (docs/diffing.md "16-bit parameter copies"): a candidate's parameters stored
// in bfloat16 or float16 (Megatron-LM's param.data under --bf16/--fp16, a BF16 checkpoint) are the
// master weights rounded once more, so they are judged against the reference rounded the same way,
// with the tolerance widened by one such rounding on each side. Everything about it is here.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "oracle/diff/metrics.h"
#include "oracle/diff/tolerance.h"
#include "oracle/golden/recorded.h"

namespace touchstone::diff {

struct StoredCopy {
  std::string type;              // "bfloat16" or "float16"
  double unit_roundoff = 0.0;    // u of one rounding to it (copy_unit_roundoff)
  double subnormal_error = 0.0;  // eta: what a rounding below its normal range may add (copy_subnormal_error)
  // The parameters the reference's update started from (the optimizer check's `before`), when they are
  // a 16-bit copy themselves: their values and the u of their type; null otherwise.
  const std::vector<double>* start = nullptr;
  double start_unit_roundoff = 0.0, start_subnormal_error = 0.0;
};

// The u of one rounding to `type`: bfloat16 2^-8 + 2^-23 (the FP32 step before it included), float16
// 2^-11; 0 for any other type.
double copy_unit_roundoff(const std::string& type);

// The eta of one rounding to `type`, half the spacing of its subnormals, where the error is absolute:
// |rnd(x) - x| <= u |x| + eta. bfloat16 2^-133 (2^-134, and 2^-150 of the FP32 step), float16 2^-25.
double copy_subnormal_error(const std::string& type);

// The stored copy a candidate tensor of `group` ("params", "init") stored as `dtype` is, if it is one.
std::optional<StoredCopy> stored_copy_of(const std::string& group, const std::string& dtype);

// `value` rounded to `type` as production makes its copy: bfloat16 through FP32 (round_to_bf16),
// float16 directly (round_to_fp16); unchanged for any other type.
double round_to_copy(double value, const std::string& type);

// A tensor-wide tolerance (relative L2, max-abs / max|g|) widened by one rounding of unit roundoff u on
// each side: A = (tau + u (2 + tau)) / (1 - u), plus a (A + 2) for the subnormals' absolute error, with
// a = eta sqrt(n) / ||rnd(g)|| for the relative L2 and eta / max|rnd(g)| for max-abs (0: none).
Tolerance widened_tolerance(const Tolerance& tolerance, double u, double absolute_l2 = 0.0,
                            double absolute_max = 0.0);

// A bound of one element's own, |m - g| <= bound, widened by one rounding on each side:
// bound + u (2 |g| + bound) + 2 eta; NaN (no bound of its own) stays NaN.
double widened_bound(double bound, double reference, double u, double eta = 0.0);

// Judges a copy: `reference` rounded to copy.type (its dtype set to it), `tolerance` and `bounds` first
// given the start's rounding (when copy.start is set) and then widened, from the unrounded reference.
void judge_as_copy(const StoredCopy& copy, Recorded& reference, Tolerance& tolerance, ElementBounds& bounds);

// The report's note for a group of copies, e.g. "steps/1/params: bfloat16 copies, ...".
std::string copy_note(const std::string& group_path, const std::string& type);

}  // namespace touchstone::diff
