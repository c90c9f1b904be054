// exp over an array of doubles, for the FP64 attention tiles' exponentials (two per visible score:
// the forward's P~ and the backward's recomputed P), where a call of libm's exp per element took a
// fifth of the time of a long window's step. The arithmetic is the same in every element, without
// branches, so that the loop runs in SIMD lanes; the CPU's widest supported form (AVX-512, AVX2 or SSE2) is
// picked at run time, and all give the same bits because all use only IEEE additions and
// multiplications, in the same order (no fused multiply-add).
//
//   exp(x) = 2^n exp(r),  n = round(x / ln 2),  r = x - n ln 2,  |r| <= ln(2) / 2
//   exp(r) = 1 + r + r^2 Q(r),  Q(r) = sum_{k=2}^{13} r^(k-2) / k!   (the first term left out,
//            r^14 / 14! < 4e-18, is far below FP64's half ulp 1.1e-16; Q in Estrin's scheme, whose
//            dependent chain is 4 operations deep instead of Horner's 12)
// with ln 2 in two parts (Cody and Waite) so that n ln 2 is subtracted exactly, and 2^n built in the
// exponent bits. Within 2 ulp of the exact exp (tests/unit/test_exp_fp64.cpp measures it against
// libm's); exp(0) = 1 exactly, so a row's largest score still contributes exactly 1 to its sum.
#pragma once

#include <cstdint>

namespace touchstone::cpu {

// Below this exp(x) is subnormal (< 2.2e-308): the result is 0, as for x = -inf, the masked scores.
// It adds nothing to the attention's sums, which are >= 1.
constexpr double kExpFp64Lowest = -708.0;
// Above this the result is that of the bound (the attention's arguments are <= 0 up to rounding).
constexpr double kExpFp64Highest = 709.0;

// y[i] = exp(x[i]) for 0 <= i < n; y may be x.
void exp_fp64(const double* x, double* y, int64_t n);

}  // namespace touchstone::cpu
