// CPU emulation of the part of the CUDA runtime the backend uses (TOUCHSTONE_CUDA_EMULATION builds,
// docs/cuda.md "Emulation"): the kernel files compile unchanged as C++ with this header in place of
// the toolkit's, device memory is host memory, and a kernel launch runs every block of the grid in
// order, each as kBlockThreads fibers that switch at __syncthreads (emulator.cpp). It tests the
// kernels' indexing, reduction order and rounding on machines without a GPU; it says nothing about
// the GPU's memory model, warp scheduling or speed.
#pragma once

#include <math.h>  // the global float and double overloads device code calls unqualified

#include <cstddef>
#include <cstdint>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// All fibers of a block share a function-local static, as a block shares its shared memory; blocks
// run one after another, so one copy serves every block.
#define __shared__ static

namespace touchstone::cuda::emulation {
struct Dim {
  unsigned x = 0, y = 0, z = 0;
};
}  // namespace touchstone::cuda::emulation

// The built-in variables, set by the emulator before it resumes a fiber.
inline touchstone::cuda::emulation::Dim threadIdx, blockIdx, blockDim, gridDim;
void __syncthreads();

struct double2 {
  double x, y;
};

template <typename T>
inline T max(T a, T b) {
  return a < b ? b : a;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dmul_rn(double a, double b) { return a * b; }

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
using cudaStream_t = struct EmulatedStream*;
constexpr unsigned cudaStreamNonBlocking = 1;
struct cudaDeviceProp {
  char name[256];
};

const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void** pointer, size_t bytes);
cudaError_t cudaFree(void* pointer);
cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
