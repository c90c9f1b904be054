// CPU emulation of __nv_bfloat16 (see cuda_runtime.h here): the BF16 bits, converted with the same
// round-to-nearest-even as the toolkit's __float2bfloat16_rn.
#pragma once

#include <cstdint>

#include "kernels/precision.h"

struct __nv_bfloat16 {
  uint16_t bits;
};

inline __nv_bfloat16 __float2bfloat16_rn(float value) { return {touchstone::bf16_bits_from_float(value)}; }
inline float __bfloat162float(__nv_bfloat16 value) { return touchstone::float_from_bf16_bits(value.bits); }
