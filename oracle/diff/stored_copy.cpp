// 16-bit parameter copies: the reference rounded to the candidate's type and the tolerance widened by
// one rounding on each side.
//
// Why the widening. m is the candidate's unrounded value (its master weight), c = rnd(m) what it stored,
// g the reference and rnd(g) what it is compared with. Rounding to nearest moves x by at most
// u |x| + eta (u the unit roundoff; eta, half the subnormals' spacing, only below the normal range), so
//   |rnd(m) - rnd(g)| <= |m - g| + u (|m| + |g|) + 2 eta,   and |m| <= |g| + |m - g|.
// Per element, |m - g| <= b gives |c - rnd(g)| <= b + u (2 |g| + b) + 2 eta. For the tensor-wide rule
// (n elements), ||m - g|| <= tau ||g|| gives ||c - rnd(g)|| <= (tau + u (2 + tau)) ||g|| + 2 eta sqrt(n),
// and the metrics normalise by the rounded reference, R = ||rnd(g)|| >= (1 - u) ||g|| - eta sqrt(n):
// with A = (tau + u (2 + tau)) / (1 - u) and a = eta sqrt(n) / R, tau becomes A + a (A + 2) (the same
// for max |.| with a = eta / max|rnd(g)|). a is 0 unless the tensor is close to the subnormals.
//
// The start's rounding. When the update the reference applies starts from a 16-bit copy p (the
// candidate's parameters after s-1, Judge::optimizer_inputs), the candidate's own optimizer started
// from its master p_m with rnd(p_m) = p, so |p_m - p| <= u_s |p| + eta_s (x = rnd(x) (1 + d),
// |d| <= u_s, for normal x). AdamW is p' = (1 - lr wd) p - lr a with a independent of p and
// 0 <= lr wd <= 1, so the two updates differ by at most that much more: b_i + u_s |p_i| + eta_s per
// element, and tau + (u_s ||p|| + eta_s sqrt(n)) / ||g|| (max: tau + (u_s max|p| + eta_s) / max|g|)
// over the elements the tensor rule judges, before the widening above.
//
// u: float16 2^-11; bfloat16 2^-8 for one rounding from FP32, plus 2^-24 when the value first went
// from FP64 to FP32 (round_to_bf16), bounded by 2^-8 + 2^-23.
#include "oracle/diff/stored_copy.h"

#include <algorithm>
#include <cmath>

#include "kernels/precision.h"

namespace touchstone::diff {

double copy_unit_roundoff(const std::string& type) {
  if (type == "bfloat16") return 0x1p-8 + 0x1p-23;
  if (type == "float16") return 0x1p-11;
  return 0.0;
}

double copy_subnormal_error(const std::string& type) {
  if (type == "bfloat16") return 0x1p-133;
  if (type == "float16") return 0x1p-25;
  return 0.0;
}

std::optional<StoredCopy> stored_copy_of(const std::string& group, const std::string& dtype) {
  if ((group != "params" && group != "init") || copy_unit_roundoff(dtype) == 0.0) return std::nullopt;
  StoredCopy copy;
  copy.type = dtype;
  copy.unit_roundoff = copy_unit_roundoff(dtype);
  copy.subnormal_error = copy_subnormal_error(dtype);
  return copy;
}

double round_to_copy(double value, const std::string& type) {
  if (type == "bfloat16") return round_to_bf16(value);
  if (type == "float16") return round_to_fp16(value);
  return value;
}

Tolerance widened_tolerance(const Tolerance& tolerance, double u, double absolute_l2, double absolute_max) {
  auto widen = [u](double tau, double a) {
    const double widened = (tau + u * (2.0 + tau)) / (1.0 - u);
    return widened + a * (widened + 2.0);
  };
  return Tolerance{widen(tolerance.relative_l2, absolute_l2),
                   widen(tolerance.max_abs_normalized, absolute_max)};
}

double widened_bound(double bound, double reference, double u, double eta) {
  return bound + u * (2.0 * std::fabs(reference) + bound) + 2.0 * eta;  // NaN stays NaN
}

void judge_as_copy(const StoredCopy& copy, Recorded& reference, Tolerance& tolerance, ElementBounds& bounds) {
  const std::vector<double>& g = reference.values;
  auto in_rule = [&](size_t i) { return bounds.empty() || std::isnan(bounds[i]); };
  // compare_values normalises by the reference, by 1 when it is all zeros; so are these terms.
  auto normalised = [](double value, double norm) { return value / (norm > 0 ? norm : 1.0); };
  if (copy.start != nullptr && copy.start->size() == g.size()) {
    const std::vector<double>& p = *copy.start;
    const double us = copy.start_unit_roundoff, eta = copy.start_subnormal_error;
    double p2 = 0.0, g2 = 0.0, p_max = 0.0, g_max = 0.0, n = 0.0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (!in_rule(i)) {
        bounds[i] += us * std::fabs(p[i]) + eta;
        continue;
      }
      p2 += p[i] * p[i];
      g2 += g[i] * g[i];
      p_max = std::max(p_max, std::fabs(p[i]));
      g_max = std::max(g_max, std::fabs(g[i]));
      n += 1.0;
    }
    tolerance.relative_l2 += normalised(us * std::sqrt(p2) + eta * std::sqrt(n), std::sqrt(g2));
    tolerance.max_abs_normalized += normalised(us * p_max + eta, g_max);
  }
  for (size_t i = 0; i < bounds.size() && i < g.size(); ++i) {
    bounds[i] = widened_bound(bounds[i], g[i], copy.unit_roundoff, copy.subnormal_error);
  }
  for (double& x : reference.values) x = round_to_copy(x, copy.type);
  reference.dtype = copy.type;
  double r2 = 0.0, r_max = 0.0, n = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!in_rule(i)) continue;
    r2 += g[i] * g[i];
    r_max = std::max(r_max, std::fabs(g[i]));
    n += 1.0;
  }
  const double eta = copy.subnormal_error;
  tolerance = widened_tolerance(tolerance, copy.unit_roundoff, normalised(eta * std::sqrt(n), std::sqrt(r2)),
                                normalised(eta, r_max));
}

std::string copy_note(const std::string& group_path, const std::string& type) {
  return group_path + ": " + type + " copies, compared with the reference rounded to " + type +
         " (tolerance + one " + type + " rounding on each side)";
}

}  // namespace touchstone::diff
