// exp over an array of doubles, for the FP64 kernels' exponentials: the attention tiles' (two per
// visible score: the forward's P~ and the backward's recomputed P), where a call of libm's exp per
// element took a fifth of the time of a long window's step, SwiGLU's sigmoid and cross entropy's. The
// arithmetic is the same in every element, without branches, so that the loop runs in SIMD lanes; the CPU's
// widest supported form (AVX-512, AVX2 or SSE2) is picked at run time, and all give the same bits because all
// use only IEEE additions and multiplications, in the same order (no fused multiply-add).
//
//   exp(x) = 2^n exp(r),  n = round(x / ln 2),  r = x - n ln 2,  |r| <= ln(2) / 2
//   exp(r) = 1 + r + r^2 Q(r),  Q(r) = sum_{k=2}^{13} r^(k-2) / k!   (the first term left out,
//            r^14 / 14! < 4e-18, is far below FP64's half ulp 1.1e-16; Q in Estrin's scheme, whose
//            dependent chain is 4 operations deep instead of Horner's 12)
// with ln 2 in two parts (Cody and Waite) so that n ln 2 is subtracted exactly, and 2^n built in the
// exponent bits. Within 2 ulp of the exact exp (tests/unit/test_exp_fp64.cpp measures it against
// libm's); exp(0) = 1 exactly, so a row's largest score still contributes exactly 1 to its sum.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace touchstone::cpu {

// Below this exp(x) is subnormal (< 2.2e-308): the result is 0, as for x = -inf, the masked scores.
// It adds nothing to the sums it enters (the attention's and cross entropy's are >= 1, SwiGLU's 1 + e).
constexpr double kExpFp64Lowest = -708.0;
// Above this the result is +inf: exp overflows at 709.78, and between the two the result is taken as
// overflowed too (SwiGLU's sigmoid 1 / (1 + e) is then 0 instead of a subnormal below 1e-307).
constexpr double kExpFp64Highest = 709.0;

// y[i] = exp(x[i]) for 0 <= i < n; y may be x. NaN stays NaN.
void exp_fp64(const double* x, double* y, int64_t n);

// x[i] = exp(x[i]) in a kernel's compute type C: FP64 through exp_fp64; FP32 through std::exp on the
// float value of x[i] (FP32 and BF16 modes keep libm's expf, the exponential their bits were fixed
// with).
template <typename C>
void exp_in_place(double* x, int64_t n) {
  if constexpr (std::is_same_v<C, double>) {
    exp_fp64(x, x, n);
  } else {
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<double>(std::exp(static_cast<C>(x[i])));
  }
}

}  // namespace touchstone::cpu
