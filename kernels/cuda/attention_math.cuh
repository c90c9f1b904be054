// The scalar device helpers of the attention kernels (attention.cu, attention_merge.cu): exp and log in
// the compute type (double in FP64 mode, float otherwise), and a product rounded on its own.
#pragma once

#include <cmath>

#include "kernels/cuda/device.cuh"  // __device__ and the intrinsics, on a GPU or in the emulation

namespace touchstone::cuda {

__device__ inline float exp_of(float x) { return expf(x); }
__device__ inline double exp_of(double x) { return exp(x); }
__device__ inline float log_of(float x) { return logf(x); }
__device__ inline double log_of(double x) { return log(x); }

// a * b rounded on its own, never fused into a following add: the CPU rounds a GEMM's alpha * sum to
// FP32 before adding it to the FP32 accumulator, and its scalar loops do not contract.
__device__ inline float rounded_product(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double rounded_product(double a, double b) { return __dmul_rn(a, b); }

}  // namespace touchstone::cuda
