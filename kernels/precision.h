// Number formats and the rounding between them (host and CUDA device code share these). Storage is always
// double; a value "in" FP32 or BF16 is a double that the format represents exactly, produced by the rounding
// functions below. Which operator rounds where is a property of the backend (kernels/backend.h, Precision),
// documented in docs/precision.md.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "common/host_device.h"
#include "common/options.h"  // enum class Precision: the config's precision, and its names

namespace touchstone {

// FP32 -> BF16, round to nearest, ties to even; NaN stays NaN (quiet), overflow goes to infinity.
// Returns the upper 16 bits of the BF16 value's FP32 encoding.
TOUCHSTONE_HOST_DEVICE inline uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  return std::bit_cast<uint32_t>(value);
#endif
}

TOUCHSTONE_HOST_DEVICE inline float float_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

TOUCHSTONE_HOST_DEVICE inline uint16_t bf16_bits_from_float(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN, quiet
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

TOUCHSTONE_HOST_DEVICE inline float float_from_bf16_bits(uint16_t bits) {
  return float_from_bits(static_cast<uint32_t>(bits) << 16);
}

// double -> FP32 -> BF16: rounds twice, as production does when an FP32 result is stored in BF16.
TOUCHSTONE_HOST_DEVICE inline double round_to_bf16(double value) {
  return static_cast<double>(float_from_bf16_bits(bf16_bits_from_float(static_cast<float>(value))));
}

TOUCHSTONE_HOST_DEVICE inline double round_to_fp32(double value) {
  return static_cast<double>(static_cast<float>(value));
}

// double -> FP16 (IEEE binary16) in one rounding, to nearest, ties to even: 11 significand bits for
// |x| >= 2^-14, subnormals with spacing 2^-24 below, infinity from 65520 on (the midpoint between the
// largest value 65504 and 2^16, which ties to the even 2^16); NaN stays NaN, the sign of zero is kept.
// Host-only (CUDA device code has no FP16 storage path).
inline double round_to_fp16(double value) {
  const double magnitude = std::fabs(value);
  if (!(magnitude < 65520.0)) return magnitude >= 65520.0 ? std::copysign(HUGE_VAL, value) : value;
  int exponent = 0;
  (void)std::frexp(magnitude, &exponent);                         // magnitude = f 2^exponent, f in [0.5, 1)
  const int spacing = exponent - 11 > -24 ? exponent - 11 : -24;  // log2 of the ulp at this magnitude
  const double scaled = std::ldexp(magnitude, -spacing);          // exact: below 2^11
  double rounded = std::floor(scaled);
  const double rest = scaled - rounded;  // exact
  if (rest > 0.5 || (rest == 0.5 && std::fmod(rounded, 2.0) != 0.0)) rounded += 1.0;
  return std::copysign(std::ldexp(rounded, spacing), value);
}

}  // namespace touchstone
