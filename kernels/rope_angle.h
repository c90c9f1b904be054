// RoPE's rotation angles: pair i (of D/2) at a position turns by position * theta^(-2i/D), in double, as
// a precomputed table would hold it. The CPU and CUDA backends both take them from here.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace touchstone {

// theta^(-2i/D) for i in [0, D/2): computed once per call, not once per token.
inline std::vector<double> rope_frequencies(int64_t head_dim, double theta) {
  std::vector<double> frequencies(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < frequencies.size(); ++i)
    frequencies[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  return frequencies;
}

// The angle of a pair at a position, from that pair's entry of rope_frequencies.
inline double rope_angle(double position, double frequency) { return position * frequency; }

}  // namespace touchstone
