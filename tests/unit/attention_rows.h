// Rows of attention tensors by position, for the tests of attention over blocks of a window
// (test_attention_blocks.cpp) and of context-parallel attention (tests/mpi/test_context_attention.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace touchstone::testing {

// Rows `positions` of x, a tensor of `slices` slices of [T, width] each (windows x heads slices for
// q, k, v, dq, dk, dv and lse (width 1); windows slices of width NH*D for out and dout, whose rows are
// tokens), in slice order.
inline std::vector<double> take_rows(const std::vector<double>& x, int64_t slices, int64_t T, int64_t width,
                                     const std::vector<int32_t>& positions) {
  std::vector<double> y;
  for (int64_t slice = 0; slice < slices; ++slice) {
    for (int32_t p : positions) {
      const auto row = x.begin() + (slice * T + p) * width;
      y.insert(y.end(), row, row + width);
    }
  }
  return y;
}

// Adds rows laid out as take_rows returns them back into x at `positions`.
inline void add_rows(const std::vector<double>& y, int64_t slices, int64_t T, int64_t width,
                     const std::vector<int32_t>& positions, std::vector<double>& x) {
  size_t next = 0;
  for (int64_t slice = 0; slice < slices; ++slice) {
    for (int32_t p : positions) {
      for (int64_t d = 0; d < width; ++d) x[static_cast<size_t>((slice * T + p) * width + d)] += y[next++];
    }
  }
}

// ||got - want|| / ||want||. Single-token documents make dq and dk exactly 0 (P = 1, and dP_ii - Delta_i
// is one dot product taken twice): then only an exact 0 passes.
inline double relative_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  if (norm == 0) return diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

}  // namespace touchstone::testing
