// cpu::exp_fp64 (kernels/cpu/exp_fp64.h), the FP64 kernels' exponential: within 0.7 ulp of the exact
// exp and 2 ulp of libm's over its whole range, exact where the kernels rely on it (exp(0) = 1,
// exp(-inf) = 0, overflow to +inf), NaN kept, the same bits whether an element is computed in a SIMD
// lane or alone, and in every form (AVX-512, AVX2, portable) this CPU runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/exp_fp64.h"

namespace touchstone {
namespace {

// Distance in units in the last place between two positive finite doubles.
int64_t ulps_apart(double a, double b) {
  const int64_t x = std::bit_cast<int64_t>(a), y = std::bit_cast<int64_t>(b);
  return x > y ? x - y : y - x;
}

// The bound against the exact exp, in ulp of the result, each part relative to a result in [0.98, 1)
// where the ulp is smallest (2^-53): the final addition hi + (hi t + lo) rounds once, 0.5; before it,
// the fused hi t + lo (|.| <= 0.044) rounds by at most 2^-58, 0.03; t = r + r^2 Q(r) (|t| <= 0.022)
// carries a few roundings of its own size, 3 * 2^-53 * 0.022 = 0.07, and the polynomial's truncation
// r^8 / 8! < 1.3e-18, 0.02; r = x - k ln(2) / 16 is exact up to the rounding of k * kStepLow,
// 2^-59, 0.02; the table's hi + lo is 2^(j/16) to 2^-106 and the scaling by 2^n is exact. Sum 0.64;
// the reference (long double expl, 11 more bits) adds under 0.01. 0.7 ulp.
constexpr double kExactUlpBound = 0.7;
// Against libm's exp (glibc documents < 1 ulp): under 1.7 ulp apart, at most two representable steps
// where a binade boundary lies between them.
constexpr int64_t kUlpBound = 2;

// |y - e| in ulps of the double nearest e, e exact enough (long double) and positive normal.
double ulps_from_exact(double y, long double e) {
  const double nearest = static_cast<double>(e);
  const double ulp = std::nextafter(nearest, std::numeric_limits<double>::infinity()) - nearest;
  return static_cast<double>(std::fabs(static_cast<long double>(y) - e) / ulp);
}

TEST(ExpFp64, WithinAnUlpOfTheExactExpAndTwoOfLibmsOverItsRange) {
  std::mt19937_64 generator(2026);
  std::uniform_real_distribution<double> whole(cpu::kExpFp64Lowest, cpu::kExpFp64Highest);
  std::uniform_real_distribution<double> scores(-40.0, 1e-3);  // where the attention's arguments lie
  std::vector<double> x(1 << 20);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 2 == 0 ? whole(generator) : scores(generator);
  std::vector<double> y(x.size());
  cpu::exp_fp64(x.data(), y.data(), static_cast<int64_t>(x.size()));
  int64_t worst = 0;
  double worst_exact = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, ulps_apart(y[i], std::exp(x[i])));
    worst_exact = std::max(worst_exact, ulps_from_exact(y[i], std::exp(static_cast<long double>(x[i]))));
  }
  std::cout << "worst distance from libm's exp: " << worst << " ulp; from the exact exp: " << worst_exact
            << " ulp\n";
  EXPECT_LE(worst, kUlpBound);
  EXPECT_LE(worst_exact, kExactUlpBound);
}

TEST(ExpFp64, ExactWhereTheAttentionReliesOnIt) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x = {0.0, -0.0, -inf, -708.5, -1e300, std::nan(""), 1.0, -1.0, 709.5, inf};
  std::vector<double> y(x.size());
  cpu::exp_fp64(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 1.0);  // a row's largest score contributes exactly 1 to its sum
  EXPECT_EQ(y[1], 1.0);
  EXPECT_EQ(y[2], 0.0);  // a masked score contributes nothing
  EXPECT_EQ(y[3], 0.0);  // below the lowest normal result
  EXPECT_EQ(y[4], 0.0);
  EXPECT_TRUE(std::isnan(y[5]));  // a NaN score is not hidden
  EXPECT_LE(ulps_apart(y[6], std::exp(1.0)), kUlpBound);
  EXPECT_LE(ulps_apart(y[7], std::exp(-1.0)), kUlpBound);
  EXPECT_EQ(y[8], inf);  // above kExpFp64Highest: overflowed (SwiGLU's sigmoid then 0)
  EXPECT_EQ(y[9], inf);
}

TEST(ExpFp64, SameBitsInALaneAndAlone) {
  // 1003 elements: the vector loop takes most, its remainder the last few; each element computed
  // alone (n = 1) takes the scalar path. In place and out of place agree too.
  std::mt19937_64 generator(7);
  std::uniform_real_distribution<double> scores(-60.0, 0.5);
  std::vector<double> x(1003);
  for (double& e : x) e = scores(generator);
  std::vector<double> together(x.size());
  cpu::exp_fp64(x.data(), together.data(), static_cast<int64_t>(x.size()));
  std::vector<double> in_place = x;
  cpu::exp_fp64(in_place.data(), in_place.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    double alone = 0.0;
    cpu::exp_fp64(&x[i], &alone, 1);
    ASSERT_EQ(std::bit_cast<uint64_t>(alone), std::bit_cast<uint64_t>(together[i])) << "element " << i;
    ASSERT_EQ(std::bit_cast<uint64_t>(in_place[i]), std::bit_cast<uint64_t>(together[i])) << "element " << i;
  }
}

TEST(ExpFp64, EveryFormThisCpuRunsGivesThePortableBits) {
  // Rows of 1003 (125 vectors of 8 and a remainder) with their shifts: the whole range, the attention's
  // scores, the clamps' edges and the special values.
  constexpr int64_t kRows = 64, kCols = 1003;
  std::mt19937_64 generator(11);
  std::uniform_real_distribution<double> whole(-720.0, 720.0);
  std::uniform_real_distribution<double> scores(-40.0, 1e-3);
  std::uniform_real_distribution<double> shifts(-5.0, 5.0);
  std::vector<double> x(kRows * kCols), shift(kRows);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 2 == 0 ? whole(generator) : scores(generator);
  for (double& s : shift) s = shifts(generator);
  shift[0] = 0.0;  // the edges below reach the lanes unshifted
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> edges = {0.0,          -0.0,   -inf,    inf,
                                     std::nan(""), -708.0, 709.0,   -708.0000001,
                                     709.0000001,  1e-300, -1e-300, 0.0216608493924983};
  std::copy(edges.begin(), edges.end(), x.begin());
  std::vector<double> portable(x.size());
  cpu::exp_fp64_in_form(cpu::ExpFp64Form::kPortable, x.data(), kRows, kCols, shift.data(), portable.data());
  // The rows' form is the subtraction, then exp_fp64: the same bits as the two steps apart.
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      const double difference = x[r * kCols + c] - shift[r];
      double apart = 0.0;
      cpu::exp_fp64(&difference, &apart, 1);
      if (std::isnan(apart)) {
        ASSERT_TRUE(std::isnan(portable[r * kCols + c]));
        continue;
      }
      ASSERT_EQ(std::bit_cast<uint64_t>(apart), std::bit_cast<uint64_t>(portable[r * kCols + c]))
          << "row " << r << ", x = " << x[r * kCols + c];
    }
  }
  for (const cpu::ExpFp64Form form : {cpu::ExpFp64Form::kAvx2, cpu::ExpFp64Form::kAvx512}) {
    if (!cpu::exp_fp64_form_supported(form)) {
      std::cout << "form " << static_cast<int>(form) << " not run by this CPU\n";
      continue;
    }
    std::vector<double> y(x.size());
    cpu::exp_fp64_in_form(form, x.data(), kRows, kCols, shift.data(), y.data());
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(portable[i])) {
        ASSERT_TRUE(std::isnan(y[i])) << "form " << static_cast<int>(form) << ", element " << i;
        continue;
      }
      ASSERT_EQ(std::bit_cast<uint64_t>(y[i]), std::bit_cast<uint64_t>(portable[i]))
          << "form " << static_cast<int>(form) << ", element " << i << ", x = " << x[i];
    }
  }
}

}  // namespace
}  // namespace touchstone
