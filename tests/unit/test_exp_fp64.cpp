// cpu::exp_fp64 (kernels/cpu/exp_fp64.h), the FP64 kernels' exponential: within 2 ulp of libm's exp
// over its whole range, exact where the kernels rely on it (exp(0) = 1, exp(-inf) = 0, overflow to
// +inf), NaN kept, and the same bits whether an element is computed in a SIMD lane or alone.
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

// The bound, fixed before measuring: the reduction r = x - n ln 2 is exact up to the rounding of
// n * kLn2Low (|n| <= 1023, under 2^-53 relative to r's ulp scale), the Estrin polynomial's roundings
// add at most about 1 ulp to exp(r) in [0.7, 1.42], and the scaling by 2^n is exact; libm's exp is
// within 1 ulp (glibc documents < 1). Two ulp apart at most.
constexpr int64_t kUlpBound = 2;

TEST(ExpFp64, WithinTwoUlpOfLibmOverItsRange) {
  std::mt19937_64 generator(2026);
  std::uniform_real_distribution<double> whole(cpu::kExpFp64Lowest, cpu::kExpFp64Highest);
  std::uniform_real_distribution<double> scores(-40.0, 1e-3);  // where the attention's arguments lie
  std::vector<double> x(1 << 20);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 2 == 0 ? whole(generator) : scores(generator);
  std::vector<double> y(x.size());
  cpu::exp_fp64(x.data(), y.data(), static_cast<int64_t>(x.size()));
  int64_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulps_apart(y[i], std::exp(x[i])));
  std::cout << "worst distance from libm's exp: " << worst << " ulp\n";
  EXPECT_LE(worst, kUlpBound);
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

}  // namespace
}  // namespace touchstone
