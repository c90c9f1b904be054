// Error metrics: one pass over the elements in double precision (the stored values are exact in it).
#include "oracle/diff/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/errors.h"
#include "kernels/precision.h"
#include "oracle/golden/golden_reader.h"

namespace touchstone::diff {

std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return index;
}

namespace {

// Sign-magnitude bits -> the magnitude and sign, so that neighbouring values differ by one.
template <typename Bits, typename Float>
uint64_t ulp_between(Float a, Float b) {
  Bits ba, bb;
  std::memcpy(&ba, &a, sizeof(a));
  std::memcpy(&bb, &b, sizeof(b));
  const Bits sign = Bits(1) << (8 * sizeof(Bits) - 1);
  const uint64_t ma = static_cast<uint64_t>(ba & ~sign), mb = static_cast<uint64_t>(bb & ~sign);
  if (((ba ^ bb) & sign) == 0) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;  // across zero: both magnitudes are below 2^63, so this cannot overflow
}

// The sign-magnitude encoding of a value of a 16-bit format, from its exponent and significand (the
// value rounded to the format first, so that a value stored in it maps to its own encoding): `digits`
// significand bits, normal exponents from `min_exponent` on.
uint16_t bits16(double value, int digits, int min_exponent) {
  const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  const double magnitude = std::fabs(value);
  if (std::isnan(magnitude)) return static_cast<uint16_t>(0x7fffu);
  const int fraction = digits - 1;
  const int exponent_field = (1 << (15 - fraction)) - 1;  // all ones: infinity
  if (std::isinf(magnitude)) return static_cast<uint16_t>(sign | (exponent_field << fraction));
  if (magnitude < std::ldexp(1.0, min_exponent)) {  // subnormal: multiples of 2^(min_exponent - fraction)
    return static_cast<uint16_t>(sign |
                                 static_cast<uint16_t>(std::ldexp(magnitude, fraction - min_exponent)));
  }
  const int e = std::ilogb(magnitude);
  const auto significand = static_cast<uint32_t>(std::ldexp(magnitude, fraction - e)) - (1u << fraction);
  return static_cast<uint16_t>(sign | ((e - min_exponent + 1) << fraction) | significand);
}

}  // namespace

uint64_t ulp_distance(double a, double b, const std::string& type) {
  if (type == "float32") return ulp_between<uint32_t>(static_cast<float>(a), static_cast<float>(b));
  if (type == "bfloat16" || type == "float16") {
    const bool bf16 = type == "bfloat16";
    const int digits = bf16 ? 8 : 11, min_exponent = bf16 ? -126 : -14;
    auto bits = [&](double x) {
      const double stored = bf16 ? round_to_bf16(x) : round_to_fp16(x);
      return bits16(stored, digits, min_exponent);
    };
    return ulp_between<uint16_t>(bits(a), bits(b));
  }
  return ulp_between<uint64_t>(a, b);
}

TensorMetrics compare_values(const Recorded& golden, const Recorded& candidate, const Tolerance& tol,
                             const ElementBounds* bounds) {
  TensorMetrics m;
  m.numel = golden.numel();
  const bool float_types =
      golden.dtype == candidate.dtype && (golden.dtype == "float64" || golden.dtype == "float32" ||
                                          golden.dtype == "bfloat16" || golden.dtype == "float16");
  m.has_ulp = float_types;
  auto bound_of = [&](int64_t i) { return bounds ? (*bounds)[static_cast<size_t>(i)] : kNoElementBound; };
  double diff2 = 0.0, gold2 = 0.0, cand2 = 0.0, dot = 0.0;
  double rule_diff2 = 0.0, rule_gold2 = 0.0, rule_max_error = 0.0;
  int64_t worst = 0;
  for (int64_t i = 0; i < m.numel; ++i) {
    const double g = golden.values[static_cast<size_t>(i)], c = candidate.values[static_cast<size_t>(i)];
    if (!std::isfinite(c)) {
      if (m.non_finite++ == 0) m.first_non_finite = unravel(i, golden.shape);
      continue;
    }
    const double e = std::fabs(c - g);
    diff2 += e * e;
    gold2 += g * g;
    cand2 += c * c;
    dot += c * g;
    m.max_abs_golden = std::max(m.max_abs_golden, std::fabs(g));
    if (e > m.max_abs_error) {
      m.max_abs_error = e;
      worst = i;
    }
    if (float_types) m.max_ulp = std::max(m.max_ulp, ulp_distance(g, c, golden.dtype));
    const double bound = bound_of(i);
    if (std::isnan(bound)) {
      rule_diff2 += e * e;
      rule_gold2 += g * g;
      rule_max_error = std::max(rule_max_error, e);
    } else {
      ++m.bounded;
      const double ratio = bound > 0 ? e / bound : (e > 0 ? std::numeric_limits<double>::infinity() : 0.0);
      m.worst_bound_ratio = std::max(m.worst_bound_ratio, ratio);
      if (e > bound) ++m.over_tolerance;
    }
  }
  // The elementwise threshold is relative to the largest golden magnitude of the whole tensor.
  const double threshold = tol.max_abs_normalized * (m.max_abs_golden > 0 ? m.max_abs_golden : 1.0);
  for (int64_t i = 0; i < m.numel; ++i) {
    const double g = golden.values[static_cast<size_t>(i)], c = candidate.values[static_cast<size_t>(i)];
    if (std::isfinite(c) && std::isnan(bound_of(i)) && std::fabs(c - g) > threshold) ++m.over_tolerance;
  }
  m.max_abs_normalized = m.max_abs_golden > 0 ? m.max_abs_error / m.max_abs_golden : m.max_abs_error;
  m.relative_l2 = gold2 > 0 ? std::sqrt(diff2 / gold2) : std::sqrt(diff2);
  m.rule_relative_l2 = rule_gold2 > 0 ? std::sqrt(rule_diff2 / rule_gold2) : std::sqrt(rule_diff2);
  m.rule_max_abs_normalized = m.max_abs_golden > 0 ? rule_max_error / m.max_abs_golden : rule_max_error;
  m.cosine =
      gold2 == 0 && cand2 == 0 ? 1.0 : (gold2 == 0 || cand2 == 0 ? 0.0 : dot / std::sqrt(gold2 * cand2));
  auto ratio = [](double value, double limit) {
    return limit > 0 ? value / limit : (value > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  };
  m.tolerance_ratio =
      std::max({ratio(m.rule_relative_l2, tol.relative_l2),
                ratio(m.rule_max_abs_normalized, tol.max_abs_normalized), m.worst_bound_ratio});
  if (m.non_finite > 0) m.tolerance_ratio = std::numeric_limits<double>::infinity();
  if (m.numel > 0) {
    m.worst_index = unravel(worst, golden.shape);
    m.worst_golden = golden.values[static_cast<size_t>(worst)];
    m.worst_candidate = candidate.values[static_cast<size_t>(worst)];
  }
  return m;
}

bool passes(const TensorMetrics& metrics, const Tolerance& tol) {
  return metrics.non_finite == 0 && metrics.rule_relative_l2 <= tol.relative_l2 &&
         metrics.over_tolerance == 0 && metrics.rule_max_abs_normalized <= tol.max_abs_normalized;
}

FileDifference worst_step_difference(const std::string& candidate, const std::string& reference) {
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  FileDifference worst{"", -1.0};
  try {
    const GoldenReader cand(candidate), ref(reference);
    if (cand.steps() != ref.steps())
      return {candidate + ": records other steps than " + reference, kInfinity};
    for (int64_t step : ref.steps()) {
      for (const std::string& path : ref.step_datasets(step)) {
        if (!cand.has(path)) return {candidate + ": missing dataset " + path, kInfinity};
        const Recorded expected = ref.read(path), got = cand.read(path);
        if (got.shape != expected.shape) return {candidate + ": " + path + " has another shape", kInfinity};
        const double relative_l2 = compare_values(expected, got, Tolerance{0.0, 0.0}).relative_l2;
        if (relative_l2 > worst.relative_l2) worst = {path, relative_l2};
      }
    }
  } catch (const InputError& e) {
    return {e.what(), kInfinity};
  }
  if (worst.path.empty()) return {reference + ": no dataset compared", kInfinity};
  return worst;
}

}  // namespace touchstone::diff
