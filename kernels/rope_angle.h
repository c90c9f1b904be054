// The RoPE rotation angle of pair i (of D/2) at a position: pos * theta^(-2i/D), in double, as a
// precomputed table would hold it. The CPU and CUDA backends both take it from here.
#pragma once

#include <cmath>
#include <cstdint>

namespace touchstone {

inline double rope_angle(double position, int64_t pair, int64_t head_dim, double theta) {
  return position * std::pow(theta, -2.0 * static_cast<double>(pair) / static_cast<double>(head_dim));
}

}  // namespace touchstone
