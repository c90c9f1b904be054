// exp_fp64 (exp_fp64.h): one lane's arithmetic, and the loop compiled three times by GCC on x86-64, for
// AVX-512, AVX2 and the baseline (SSE2), the CPU picking at load time; other compilers and CPUs build the
// baseline form alone, with the same bits.
#include "kernels/cpu/exp_fp64.h"

#include <bit>
#include <limits>

namespace touchstone::cpu {

namespace {

constexpr double kLog2e = 1.4426950408889634;            // 1 / ln 2
constexpr double kLn2High = 6.93147180369123816490e-01;  // ln 2's leading 32 bits: n * kLn2High is exact
constexpr double kLn2Low = 1.90821492927058770002e-10;   // ln 2 - kLn2High
// Adding 1.5 * 2^52 rounds a double of magnitude < 2^51 to an integer, held in the low mantissa bits.
constexpr double kRoundingShift = 0x1.8p52;

inline double exp_lane(double x) {
  const double above = x < kExpFp64Lowest ? kExpFp64Lowest : x;  // NaN stays NaN
  const double clamped = above > kExpFp64Highest ? kExpFp64Highest : above;
  const double shifted = clamped * kLog2e + kRoundingShift;
  const double n = shifted - kRoundingShift;  // round(x / ln 2), in [-1022, 1023]
  const double r = (clamped - n * kLn2High) - n * kLn2Low;
  // exp(r) = 1 + r + r^2 Q(r), Q(r) = sum_{k=2}^{13} r^(k-2) / k!, Q in Estrin's scheme: pairs, then
  // pairs of pairs, so that the chain of dependent operations is 4 deep instead of Horner's 12.
  const double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
  const double e01 = 1.0 / 2 + r * (1.0 / 6), e23 = 1.0 / 24 + r * (1.0 / 120);
  const double e45 = 1.0 / 720 + r * (1.0 / 5040), e67 = 1.0 / 40320 + r * (1.0 / 362880);
  const double e89 = 1.0 / 3628800 + r * (1.0 / 39916800), e1011 = 1.0 / 479001600 + r * (1.0 / 6227020800);
  const double f0 = e01 + r2 * e23, f1 = e45 + r2 * e67, f2 = e89 + r2 * e1011;
  const double q = (f0 + r4 * f1) + r8 * f2;
  const double p = 1.0 + (r + r2 * q);
  // 2^n: the low bits of `shifted` hold n (two's complement); n + 1023 is the biased exponent, in
  // [1, 2046], shifted into place (the constant's own high bits are shifted out).
  const double two_to_n = std::bit_cast<double>((std::bit_cast<uint64_t>(shifted) + 1023) << 52);
  const double result = x > kExpFp64Highest ? std::numeric_limits<double>::infinity() : p * two_to_n;
  return x < kExpFp64Lowest ? 0.0 : result;
}

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void exp_fp64(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = exp_lane(x[i]);
}

}  // namespace touchstone::cpu
