// exp over an array of doubles, for the FP64 kernels' exponentials: the attention tiles' (two per
// visible score: the forward's P~ and the backward's recomputed P), where a call of libm's exp per
// element took a fifth of the time of a long window's step, SwiGLU's sigmoid and cross entropy's. The
// arithmetic is the same in every element, without branches, so that it runs in SIMD lanes:
//
//   exp(x) = 2^n 2^(j/16) exp(r),  k = round(16 x / ln 2) = 16 n + j (0 <= j < 16),  r = x - k ln(2) / 16
//   |r| <= ln(2) / 32 = 0.0217
//   2^(j/16) from a table of 16 entries, each held as two doubles, hi + lo (hi the nearest double, lo the
//            rest), so the table adds no rounding of its own
//   exp(r) = 1 + t,  t = r + r^2 Q(r),  Q(r) = sum_{k=2}^{7} r^(k-2) / k!   (the first term left out,
//            r^8 / 8! < 1.3e-18, is a hundredth of FP64's half ulp 1.1e-16; Q in Estrin's scheme)
//   2^(j/16) exp(r) = hi + (hi t + lo)   (one fused multiply-add, then one addition: the result's only
//            rounding of note)
// with ln(2) / 16 in two parts (Cody and Waite) so that k ln(2) / 16 is subtracted exactly, and 2^n
// built in the exponent bits. Within 0.6 ulp of the exact exp, 1 ulp of libm's (tests/unit/
// test_exp_fp64.cpp measures both); exp(0) = 1 exactly, so a row's largest score still contributes
// exactly 1 to its sum.
//
// Forms: the same operations in the same order (IEEE additions, multiplications and fused
// multiply-adds, so the same bits) written three times: AVX-512 (the table in registers, looked up
// with one permute), AVX2 with FMA (the table gathered from memory), and portable C++ (std::fma) for
// every other CPU. exp_fp64 picks the widest the CPU runs, once. On this machine (AVX-512) 0.53 ns an
// element, against 1.01 for the Cody-Waite form with a degree-13 polynomial it replaced and 8.6 for
// libm's exp; on an x86-64 without FMA (before 2013) std::fma is libm's exact software routine, the
// same bits at about 17 ns an element.
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

// y[r, c] = exp(x[r, c] - shift[r]) over x[rows, cols] (the softmax's exp(S - max), exp(S - lse)): the
// subtraction, then exp_fp64's arithmetic, in the same lanes; y may be x.
void exp_fp64_rows(const double* x, int64_t rows, int64_t cols, const double* shift, double* y);

// The forms exp_fp64 chooses from, for the test that they agree bit for bit.
enum class ExpFp64Form { kPortable, kAvx2, kAvx512 };
// Whether this build and this CPU run the form; the portable one always.
bool exp_fp64_form_supported(ExpFp64Form form);
// exp_fp64_rows in the given form, which must be supported.
void exp_fp64_in_form(ExpFp64Form form, const double* x, int64_t rows, int64_t cols, const double* shift,
                      double* y);

// y[r, c] = exp(x[r, c] - shift[r]) in a kernel's compute type C, the subtraction in C too; y may be x.
// FP64 through exp_fp64_rows; FP32 through std::exp on the float difference (FP32 and BF16 modes keep
// libm's expf, the exponential their bits were fixed with).
template <typename C>
void exp_rows(const double* x, int64_t rows, int64_t cols, const C* shift, double* y) {
  if constexpr (std::is_same_v<C, double>) {
    exp_fp64_rows(x, rows, cols, shift, y);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = r * cols; c < (r + 1) * cols; ++c)
        y[c] = static_cast<double>(std::exp(static_cast<C>(x[c]) - shift[r]));
    }
  }
}

// x[i] = exp(x[i]) in the compute type C: exp_rows with nothing subtracted (x - 0 is x, bit for bit).
template <typename C>
void exp_in_place(double* x, int64_t n) {
  const C none = 0;
  exp_rows<C>(x, 1, n, &none, x);
}

}  // namespace touchstone::cpu
