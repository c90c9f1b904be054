// An independent statement of the number formats for the rounding-point tests (docs/precision.md):
// FP32 -> BF16 round to nearest, ties to even, written from its definition on the FP32 encoding
// rather than with the library's helper; the checks that a double is exactly an FP32 or a BF16 value;
// the premise that lets a GEMM's FP32 result be computed exactly in any summation order; and
// deterministic small inputs.
#pragma once

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace touchstone::testing {

// FP32 -> BF16 by its definition: keep the upper 16 bits of the encoding; the dropped lower 16 bits
// are compared with half an ulp of the kept part (0x8000): above it the magnitude goes one ulp up,
// below it stays, exactly on it the kept part whose last bit is 0 wins. One ulp up is +0x10000 on the
// encoding whatever the sign (sign-magnitude), and a carry out of the mantissa moves the exponent, up
// to infinity past the largest finite BF16. Infinity has no dropped bits. NaN is not an input here.
inline float bf16_nearest_even(float x) {
  const auto bits = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
  const uint32_t kept = bits & 0xffff0000u, dropped = bits & 0x0000ffffu;
  const bool last_kept_bit_odd = (kept & 0x00010000u) != 0;
  const bool up = dropped > 0x8000u || (dropped == 0x8000u && last_kept_bit_odd);
  return std::bit_cast<float>(up ? kept + 0x00010000u : kept);
}

// An FP32 result stored in BF16, as a double (the backends' storage).
inline double bf16(float x) { return static_cast<double>(bf16_nearest_even(x)); }

// The rounding the mutation "truncate instead of rounding to nearest even" would do.
inline double bf16_truncated(float x) {
  return static_cast<double>(std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xffff0000u));
}

inline bool is_fp32(double v) { return static_cast<double>(static_cast<float>(v)) == v; }
inline bool is_bf16(double v) {
  return is_fp32(v) && (std::bit_cast<uint32_t>(static_cast<float>(v)) & 0xffffu) == 0;
}

// The exponent of the lowest set bit of x != 0: x is an odd multiple of 2^lowest_bit(x).
inline int lowest_bit(double x) {
  int exponent = 0;
  const double mantissa = std::frexp(std::abs(x), &exponent);  // in [0.5, 1): 53 bits as an integer
  const auto integer = static_cast<uint64_t>(std::ldexp(mantissa, 53));
  return exponent - 53 + std::countr_zero(integer);
}

// The premise of an exact FP32 GEMM reference: every term is a multiple of 2^g (g the lowest set bit
// over all terms) and sum |terms| < 2^(24 + g). Then every product (exact in double, computed from
// FP32 or BF16 factors) and every partial sum in any order and grouping is an integer multiple of 2^g
// below 2^24 of them, so FP32 represents it: SGEMM's result is the exact sum whatever its blocking,
// vector width or thread count, and so is a sum of such results accumulated in FP32.
inline bool sums_exact_in_fp32(const std::vector<double>& terms) {
  int grid = INT_MAX;
  double total = 0.0;
  for (double t : terms) {
    if (t == 0.0) continue;
    grid = std::min(grid, lowest_bit(t));
    total += std::abs(t);
  }
  return grid == INT_MAX || total < std::ldexp(1.0, 24 + grid);
}

// n values (-m .. m) * 2^-shift from a fixed seed: few mantissa bits, so products and their sums stay
// exact in FP32 (above) while sums of a dozen of them need more than BF16's 8 bits.
inline std::vector<double> small_multiples(size_t n, int m, int shift, uint32_t seed) {
  std::mt19937 gen(seed);  // mt19937's output sequence is fixed by the standard
  std::vector<double> out(n);
  const auto span = static_cast<uint32_t>(2 * m + 1);
  for (double& v : out) v = std::ldexp(static_cast<double>(static_cast<int>(gen() % span) - m), -shift);
  return out;
}

// n BF16 values of magnitude about `scale` with full 8-bit mantissas (for the elementwise kernels).
inline std::vector<double> bf16_values(size_t n, double scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<double> out(n);
  for (double& v : out) {
    const double u = static_cast<double>(gen()) / 4294967296.0;  // [0, 1)
    v = bf16(static_cast<float>(scale * (2.0 * u - 1.0)));
  }
  return out;
}

}  // namespace touchstone::testing
