// exp_fp64 (exp_fp64.h): one lane's arithmetic in portable C++, the same arithmetic in AVX-512 and in
// AVX2 intrinsics on x86-64 (GCC and Clang), each form looping over rows with the row's shift
// subtracted first, and the choice among them made once, at the first call.
#include "kernels/cpu/exp_fp64.h"

#include <bit>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TOUCHSTONE_EXP_FP64_X86 1
// GCC 12's AVX-512 intrinsics start from a deliberately undefined register (_mm512_undefined_pd), which
// its uninitialized-use analysis reports once they are inlined here.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace touchstone::cpu {

namespace {

// Adding 1.5 * 2^52 rounds a double of magnitude < 2^51 to an integer, held in the low mantissa bits.
constexpr double kRoundingShift = 0x1.8p52;
constexpr double kSixteenOverLn2 = 0x1.71547652b82fep+4;  // 16 / ln 2, rounded
// ln(2) / 16 in two parts: the leading 32 bits, so that k * kStepHigh is exact for |k| < 2^21, and the rest.
constexpr double kStepHigh = 0x1.62e42fee00000p-5;
constexpr double kStepLow = 0x1.a39ef35793c76p-37;
// 2^(j/16) = kTableHigh[j] + kTableLow[j]: the nearest double, and the nearest double to what remains
// (computed to 60 digits).
alignas(64) constexpr double kTableHigh[16] = {
    0x1.0000000000000p+0, 0x1.0b5586cf9890fp+0, 0x1.172b83c7d517bp+0, 0x1.2387a6e756238p+0,
    0x1.306fe0a31b715p+0, 0x1.3dea64c123422p+0, 0x1.4bfdad5362a27p+0, 0x1.5ab07dd485429p+0,
    0x1.6a09e667f3bcdp+0, 0x1.7a11473eb0187p+0, 0x1.8ace5422aa0dbp+0, 0x1.9c49182a3f090p+0,
    0x1.ae89f995ad3adp+0, 0x1.c199bdd85529cp+0, 0x1.d5818dcfba487p+0, 0x1.ea4afa2a490dap+0};
alignas(64) constexpr double kTableLow[16] = {0.0,
                                              0x1.8a62e4adc610bp-54,
                                              -0x1.19041b9d78a76p-55,
                                              0x1.9b07eb6c70573p-54,
                                              0x1.6f46ad23182e4p-55,
                                              0x1.ada0911f09ebcp-55,
                                              0x1.d4397afec42e2p-56,
                                              0x1.6324c054647adp-54,
                                              -0x1.bdd3413b26456p-54,
                                              -0x1.41577ee04992fp-55,
                                              0x1.6e9f156864b27p-54,
                                              0x1.c7c46b071f2bep-56,
                                              0x1.7a1cd345dcc81p-54,
                                              0x1.11065895048ddp-55,
                                              0x1.2ed02d75b3707p-55,
                                              -0x1.e9c23179c2893p-54};
// Q(r)'s coefficients, 1 / k! for k = 2 ... 7.
constexpr double kQ0 = 1.0 / 2, kQ1 = 1.0 / 6, kQ2 = 1.0 / 24, kQ3 = 1.0 / 120, kQ4 = 1.0 / 720,
                 kQ5 = 1.0 / 5040;

// One element, in the order every form follows.
inline double exp_lane(double x) {
  const double above = x < kExpFp64Lowest ? kExpFp64Lowest : x;  // NaN stays NaN
  const double clamped = above > kExpFp64Highest ? kExpFp64Highest : above;
  const double shifted = std::fma(clamped, kSixteenOverLn2, kRoundingShift);  // k in the low bits
  const double k = shifted - kRoundingShift;
  const double r = std::fma(-k, kStepLow, std::fma(-k, kStepHigh, clamped));
  const uint64_t bits = std::bit_cast<uint64_t>(shifted);
  const double high = kTableHigh[bits & 15], low = kTableLow[bits & 15];  // j = k mod 16
  const double r2 = r * r, r4 = r2 * r2;
  const double q01 = std::fma(r, kQ1, kQ0), q23 = std::fma(r, kQ3, kQ2), q45 = std::fma(r, kQ5, kQ4);
  const double q = std::fma(r4, q45, std::fma(r2, q23, q01));
  const double t = std::fma(r2, q, r);
  const double mantissa = high + std::fma(high, t, low);  // 2^(j/16) exp(r), in [0.98, 2)
  // 2^n: bits >> 4 holds n = floor(k / 16) (plus high bits of the shift constant, which the shift by 52
  // pushes out); n + 1023 is the biased exponent, in [1, 2046] inside the clamps.
  const double two_to_n = std::bit_cast<double>(((bits >> 4) + 1023) << 52);
  const double result = x > kExpFp64Highest ? std::numeric_limits<double>::infinity() : mantissa * two_to_n;
  return x < kExpFp64Lowest ? 0.0 : result;
}

void exp_portable(const double* x, int64_t rows, int64_t cols, const double* shift, double* y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = r * cols; c < (r + 1) * cols; ++c) y[c] = exp_lane(x[c] - shift[r]);
  }
}

#ifdef TOUCHSTONE_EXP_FP64_X86

// Eight lanes of exp_lane. max(lowest, x) and min(highest, x) pass a NaN x through, as exp_lane's selects do.
__attribute__((target("avx512f"))) inline __m512d exp_avx512_lanes(__m512d x, __m512d table_high_0,
                                                                   __m512d table_high_1, __m512d table_low_0,
                                                                   __m512d table_low_1) {
  const __m512d lowest = _mm512_set1_pd(kExpFp64Lowest), highest = _mm512_set1_pd(kExpFp64Highest);
  const __m512d clamped = _mm512_min_pd(highest, _mm512_max_pd(lowest, x));
  const __m512d shift = _mm512_set1_pd(kRoundingShift);
  const __m512d shifted = _mm512_fmadd_pd(clamped, _mm512_set1_pd(kSixteenOverLn2), shift);
  const __m512d k = _mm512_sub_pd(shifted, shift);
  const __m512d r =
      _mm512_fnmadd_pd(k, _mm512_set1_pd(kStepLow), _mm512_fnmadd_pd(k, _mm512_set1_pd(kStepHigh), clamped));
  const __m512i bits = _mm512_castpd_si512(shifted);
  // The permute reads the low 4 bits of each index: j, choosing among the two registers' 16 entries.
  const __m512d high = _mm512_permutex2var_pd(table_high_0, bits, table_high_1);
  const __m512d low = _mm512_permutex2var_pd(table_low_0, bits, table_low_1);
  const __m512d r2 = _mm512_mul_pd(r, r), r4 = _mm512_mul_pd(r2, r2);
  const __m512d q01 = _mm512_fmadd_pd(r, _mm512_set1_pd(kQ1), _mm512_set1_pd(kQ0));
  const __m512d q23 = _mm512_fmadd_pd(r, _mm512_set1_pd(kQ3), _mm512_set1_pd(kQ2));
  const __m512d q45 = _mm512_fmadd_pd(r, _mm512_set1_pd(kQ5), _mm512_set1_pd(kQ4));
  const __m512d q = _mm512_fmadd_pd(r4, q45, _mm512_fmadd_pd(r2, q23, q01));
  const __m512d t = _mm512_fmadd_pd(r2, q, r);
  const __m512d mantissa = _mm512_add_pd(high, _mm512_fmadd_pd(high, t, low));
  const __m512i exponent =
      _mm512_slli_epi64(_mm512_add_epi64(_mm512_srli_epi64(bits, 4), _mm512_set1_epi64(1023)), 52);
  __m512d result = _mm512_mul_pd(mantissa, _mm512_castsi512_pd(exponent));
  result = _mm512_mask_mov_pd(result, _mm512_cmp_pd_mask(x, highest, _CMP_GT_OQ),
                              _mm512_set1_pd(std::numeric_limits<double>::infinity()));
  return _mm512_mask_mov_pd(result, _mm512_cmp_pd_mask(x, lowest, _CMP_LT_OQ), _mm512_setzero_pd());
}

__attribute__((target("avx512f"))) void exp_avx512(const double* x, int64_t rows, int64_t cols,
                                                   const double* shift, double* y) {
  const __m512d table_high_0 = _mm512_load_pd(kTableHigh), table_high_1 = _mm512_load_pd(kTableHigh + 8);
  const __m512d table_low_0 = _mm512_load_pd(kTableLow), table_low_1 = _mm512_load_pd(kTableLow + 8);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x + r * cols;
    double* yr = y + r * cols;
    const __m512d row_shift = _mm512_set1_pd(shift[r]);
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const __m512d lanes = _mm512_sub_pd(_mm512_loadu_pd(xr + c), row_shift);
      _mm512_storeu_pd(yr + c, exp_avx512_lanes(lanes, table_high_0, table_high_1, table_low_0, table_low_1));
    }
    if (c < cols) {  // the last 1 to 7 elements in masked lanes (the others are not stored)
      const __mmask8 tail = static_cast<__mmask8>((1u << (cols - c)) - 1);
      const __m512d lanes = _mm512_sub_pd(_mm512_maskz_loadu_pd(tail, xr + c), row_shift);
      _mm512_mask_storeu_pd(yr + c, tail,
                            exp_avx512_lanes(lanes, table_high_0, table_high_1, table_low_0, table_low_1));
    }
  }
}

// Four lanes of exp_lane; the table entries gathered from memory (AVX2 has no two-register permute).
// Written out, as the AVX-512 form is, because GCC vectorizes exp_lane for AVX2 with emulated gathers:
// 1.57 ns an element against these intrinsics' 1.13 (and 1.63 for the form before the table).
__attribute__((target("avx2,fma"))) inline __m256d exp_avx2_lanes(__m256d x) {
  const __m256d lowest = _mm256_set1_pd(kExpFp64Lowest), highest = _mm256_set1_pd(kExpFp64Highest);
  const __m256d clamped = _mm256_min_pd(highest, _mm256_max_pd(lowest, x));
  const __m256d shift = _mm256_set1_pd(kRoundingShift);
  const __m256d shifted = _mm256_fmadd_pd(clamped, _mm256_set1_pd(kSixteenOverLn2), shift);
  const __m256d k = _mm256_sub_pd(shifted, shift);
  const __m256d r =
      _mm256_fnmadd_pd(k, _mm256_set1_pd(kStepLow), _mm256_fnmadd_pd(k, _mm256_set1_pd(kStepHigh), clamped));
  const __m256i bits = _mm256_castpd_si256(shifted);
  const __m256i j = _mm256_and_si256(bits, _mm256_set1_epi64x(15));
  const __m256d high = _mm256_i64gather_pd(kTableHigh, j, 8), low = _mm256_i64gather_pd(kTableLow, j, 8);
  const __m256d r2 = _mm256_mul_pd(r, r), r4 = _mm256_mul_pd(r2, r2);
  const __m256d q01 = _mm256_fmadd_pd(r, _mm256_set1_pd(kQ1), _mm256_set1_pd(kQ0));
  const __m256d q23 = _mm256_fmadd_pd(r, _mm256_set1_pd(kQ3), _mm256_set1_pd(kQ2));
  const __m256d q45 = _mm256_fmadd_pd(r, _mm256_set1_pd(kQ5), _mm256_set1_pd(kQ4));
  const __m256d q = _mm256_fmadd_pd(r4, q45, _mm256_fmadd_pd(r2, q23, q01));
  const __m256d t = _mm256_fmadd_pd(r2, q, r);
  const __m256d mantissa = _mm256_add_pd(high, _mm256_fmadd_pd(high, t, low));
  const __m256i exponent =
      _mm256_slli_epi64(_mm256_add_epi64(_mm256_srli_epi64(bits, 4), _mm256_set1_epi64x(1023)), 52);
  __m256d result = _mm256_mul_pd(mantissa, _mm256_castsi256_pd(exponent));
  result = _mm256_blendv_pd(result, _mm256_set1_pd(std::numeric_limits<double>::infinity()),
                            _mm256_cmp_pd(x, highest, _CMP_GT_OQ));
  return _mm256_blendv_pd(result, _mm256_setzero_pd(), _mm256_cmp_pd(x, lowest, _CMP_LT_OQ));
}

__attribute__((target("avx2,fma"))) void exp_avx2(const double* x, int64_t rows, int64_t cols,
                                                  const double* shift, double* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x + r * cols;
    double* yr = y + r * cols;
    const __m256d row_shift = _mm256_set1_pd(shift[r]);
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4)
      _mm256_storeu_pd(yr + c, exp_avx2_lanes(_mm256_sub_pd(_mm256_loadu_pd(xr + c), row_shift)));
    for (; c < cols; ++c) yr[c] = exp_lane(xr[c] - shift[r]);  // std::fma here is the CPU's own instruction
  }
}

#endif  // TOUCHSTONE_EXP_FP64_X86

}  // namespace

bool exp_fp64_form_supported(ExpFp64Form form) {
  switch (form) {
    case ExpFp64Form::kPortable:
      return true;
#ifdef TOUCHSTONE_EXP_FP64_X86
    case ExpFp64Form::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case ExpFp64Form::kAvx512:
      return __builtin_cpu_supports("avx512f");
#else
    case ExpFp64Form::kAvx2:
    case ExpFp64Form::kAvx512:
      return false;
#endif
  }
  return false;
}

void exp_fp64_in_form(ExpFp64Form form, const double* x, int64_t rows, int64_t cols, const double* shift,
                      double* y) {
#ifdef TOUCHSTONE_EXP_FP64_X86
  switch (form) {
    case ExpFp64Form::kAvx512:
      exp_avx512(x, rows, cols, shift, y);
      return;
    case ExpFp64Form::kAvx2:
      exp_avx2(x, rows, cols, shift, y);
      return;
    case ExpFp64Form::kPortable:
      break;
  }
#else
  (void)form;
#endif
  exp_portable(x, rows, cols, shift, y);
}

void exp_fp64_rows(const double* x, int64_t rows, int64_t cols, const double* shift, double* y) {
  static const ExpFp64Form widest = exp_fp64_form_supported(ExpFp64Form::kAvx512) ? ExpFp64Form::kAvx512
                                    : exp_fp64_form_supported(ExpFp64Form::kAvx2) ? ExpFp64Form::kAvx2
                                                                                  : ExpFp64Form::kPortable;
  exp_fp64_in_form(widest, x, rows, cols, shift, y);
}

void exp_fp64(const double* x, double* y, int64_t n) {
  const double none = 0.0;  // x - 0 is x, bit for bit (-0 - 0 is -0)
  exp_fp64_rows(x, 1, n, &none, y);
}

}  // namespace touchstone::cpu
