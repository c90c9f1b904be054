// The fixed orders of kernels/cpu/row_reductions.h: chained_sum adds in the four chains its comment
// writes out (bit for bit, for every length and its tail), statistic_sum keeps one chain in index order
// for FP32 and goes on from the running sum it is given, and row_max passes over NaN and returns -inf
// for an empty row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/row_reductions.h"

namespace touchstone {
namespace {

std::vector<double> random_row(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x(static_cast<size_t>(n));
  for (double& v : x) v = u(rng) * std::exp2(static_cast<int>(rng() % 40) - 20);  // mixed magnitudes
  return x;
}

// (x0 + x4 + ...) + (x1 + x5 + ...) and so on, the tail past the last group of four in chain 0, the
// chains added as (0 + 1) + (2 + 3): written out, not through the helper.
double four_chains(const std::vector<double>& x) {
  const auto n = static_cast<int64_t>(x.size());
  double chain[4] = {0, 0, 0, 0};
  const int64_t whole = n / 4 * 4;
  for (int64_t k = 0; k < 4; ++k) {
    for (int64_t c = k; c < whole; c += 4) chain[k] += x[static_cast<size_t>(c)];
  }
  for (int64_t c = whole; c < n; ++c) chain[0] += x[static_cast<size_t>(c)];
  return (chain[0] + chain[1]) + (chain[2] + chain[3]);
}

TEST(RowReductions, ChainedSumIsTheFourChainsBitForBit) {
  for (int64_t n : {0, 1, 3, 4, 5, 7, 64, 255, 256, 1001}) {
    const std::vector<double> x = random_row(n, static_cast<uint32_t>(n) + 1);
    EXPECT_EQ(cpu::row_sum<double>(x.data(), n), four_chains(x)) << "n = " << n;
    EXPECT_EQ(cpu::chained_sum<double>(n, [&x](int64_t c) { return x[static_cast<size_t>(c)]; }),
              four_chains(x))
        << "n = " << n;
  }
}

TEST(RowReductions, StatisticSumChainsInFp64AndKeepsIndexOrderInFp32) {
  const int64_t n = 1001;
  const std::vector<double> x = random_row(n, 7);
  const auto term64 = [&x](int64_t c) { return x[static_cast<size_t>(c)]; };
  EXPECT_EQ(cpu::statistic_sum<double>(n, term64, 0.25), 0.25 + four_chains(x));
  const auto term32 = [&x](int64_t c) { return static_cast<float>(x[static_cast<size_t>(c)]); };
  float serial = 0.25f;
  for (int64_t c = 0; c < n; ++c) serial += term32(c);
  EXPECT_EQ(cpu::statistic_sum<float>(n, term32, 0.25f), serial);
}

TEST(RowReductions, RowMaxPassesOverNanAndIsMinusInfinityWhenEmpty) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> x{nan, -3.0, 2.5, nan, 1.0, 2.0, nan};  // a NaN in every chain and the tail
  EXPECT_EQ(cpu::row_max<double>(x.data(), static_cast<int64_t>(x.size())), 2.5);
  EXPECT_EQ(cpu::row_max<float>(x.data(), static_cast<int64_t>(x.size())), 2.5f);
  EXPECT_EQ(cpu::row_max<double>(x.data(), 0), -std::numeric_limits<double>::infinity());
  const std::vector<double> all_nan{nan, nan, nan, nan, nan};
  EXPECT_EQ(cpu::row_max<double>(all_nan.data(), 5), -std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace touchstone
