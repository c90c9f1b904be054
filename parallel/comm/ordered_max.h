// The maximum every process group reduces with: MPI's host operator and the NCCL group's device
// kernel share this one definition, so both give the same bits.
//
// MPI_MAX (and a plain max) on doubles is exact but not a total order: max(-0.0, +0.0) and NaN
// payloads depend on which operand comes first, and ranks combine in different orders. Ordering NaN
// (one canonical quiet NaN) above everything and +0.0 above -0.0 makes the result independent of the
// order, so every rank gets the same bits.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

namespace touchstone {

// The quiet NaN every NaN-carrying maximum returns: x86-64's and AArch64's default quiet NaN.
constexpr uint64_t kCanonicalNanBits = 0x7ff8000000000000ULL;

TOUCHSTONE_HOST_DEVICE inline uint64_t double_bits(double value) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(value));
#else
  return std::bit_cast<uint64_t>(value);
#endif
}

TOUCHSTONE_HOST_DEVICE inline double double_from_bits(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  return std::bit_cast<double>(bits);
#endif
}

TOUCHSTONE_HOST_DEVICE inline double ordered_max(double a, double b) {
  if (a != a || b != b) return double_from_bits(kCanonicalNanBits);  // either is NaN
  if (a == b) return (double_bits(a) >> 63) != 0 ? b : a;            // -0 == +0: keep the positive one
  return a > b ? a : b;
}

}  // namespace touchstone
