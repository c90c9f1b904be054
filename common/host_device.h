// TOUCHSTONE_HOST_DEVICE marks a small inline function that both the host compiler and CUDA device
// code compile (RNG, rounding), so the CPU reference and the GPU kernels share one definition.
#pragma once

#if defined(__CUDACC__)
#define TOUCHSTONE_HOST_DEVICE __host__ __device__
#else
#define TOUCHSTONE_HOST_DEVICE
#endif
