// Maxima and sums along a row in fixed orders of interleaved chains: the CPU kernels' reductions over a
// row (attention tiles, RMSNorm statistics, the cross entropy's logits).
//
// One chain (s += x[0]; s += x[1]; ...) waits for each addition before the next: four cycles an
// element on current x86 cores. Four chains run side by side, (x0 + x4 + ...) + (x1 + x5 + ...) and so
// on, the chains added last as (0 + 1) + (2 + 3). The order is fixed by n alone, so every call, thread
// count and CPU gives the same bits; it is a different order from one chain, within the bound of any
// order of a sum (n - 1) u sum |x_i| (u = 2^-53 in FP64).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace touchstone::cpu {

// The sum of term(c) over c in [0, n) in four interleaved chains (above).
template <typename C, typename Term>
C chained_sum(int64_t n, const Term& term) {
  C lanes[4] = {0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 4 <= n; c += 4) {
    for (int64_t k = 0; k < 4; ++k) lanes[k] += term(c + k);
  }
  for (; c < n; ++c) lanes[0] += term(c);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

// The sum of C(x[c]) over x[0, n) in four interleaved chains.
template <typename C>
C row_sum(const double* x, int64_t n) {
  return chained_sum<C>(n, [x](int64_t c) { return static_cast<C>(x[c]); });
}

// The largest C(x[c]) of x[0, n) (-inf for n = 0), NaN passed over as by the chain m = std::max(m,
// C(x[c])) from m = -inf, in four interleaved chains. A maximum is exact, so the order can change only
// the sign of a zero result, which nothing after it can tell: exp(x - (+-0)) and x - (+-0) are equal.
template <typename C>
C row_max(const double* x, int64_t n) {
  constexpr C kLowest = -std::numeric_limits<C>::infinity();
  C lanes[4] = {kLowest, kLowest, kLowest, kLowest};
  int64_t c = 0;
  for (; c + 4 <= n; c += 4) {
    for (int64_t k = 0; k < 4; ++k) lanes[k] = std::max(lanes[k], static_cast<C>(x[c + k]));
  }
  for (; c < n; ++c) lanes[0] = std::max(lanes[0], static_cast<C>(x[c]));
  return std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
}

// sum + the sum of term(c) over c in [0, n), a statistic's sum in the kernels' precision T: in FP64 the
// four chains of chained_sum, added to sum; in FP32 (the statistics of the FP32 and BF16 modes) one chain
// that goes on from sum in index order, the order docs/precision.md gives for those modes and
// tests/unit/test_rounding_points.cpp replays.
template <typename T, typename Term>
T statistic_sum(int64_t n, const Term& term, T sum = 0) {
  if constexpr (std::is_same_v<T, double>) {
    return sum + chained_sum<T>(n, term);
  } else {
    for (int64_t c = 0; c < n; ++c) sum += term(c);
    return sum;
  }
}

}  // namespace touchstone::cpu
