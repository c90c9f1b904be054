// What every CUDA kernel file of the backend shares: error checks that throw a one-line message,
// device buffers, the staging of the host operands of one operator call, the deterministic block
// reduction and the grid-stride loop.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/launch.h"
#if defined(TOUCHSTONE_CUDA_EMULATION)
#include "kernels/cuda/emulation/emulator.h"
#endif

namespace touchstone::cuda {

// Throw std::runtime_error("CUDA <what>: <error string>") unless the call succeeded.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);
// After a launch: a bad configuration is reported here, a fault in the kernel at the next sync.
void check_launch(const char* kernel);

// Untyped device memory that only grows, reused from call to call.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  ~DeviceBytes();
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  DeviceBytes(DeviceBytes&& other) noexcept;
  DeviceBytes& operator=(DeviceBytes&&) = delete;
  void* reserve(size_t bytes);  // at least `bytes`; earlier contents are lost when it grows
  size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// The operands of one operator call. The kernel interface takes host pointers (docs/cuda.md: the
// model's buffers live on the host), so a call uploads its inputs, runs on the device and downloads
// its outputs. Buffers are handed out in order from a list that is reused by every call, so after the
// first step no call allocates.
class Staging {
 public:
  explicit Staging(cudaStream_t stream) : stream_(stream) {}
  void begin() { next_ = 0; }  // each operator call starts here
  template <typename T>
  T* upload(const T* host, int64_t n) {  // null stays null (an absent optional operand)
    if (host == nullptr) return nullptr;
    T* device = output<T>(n);
    copy_to_device(device, host, n * static_cast<int64_t>(sizeof(T)));
    return device;
  }
  template <typename T>
  T* output(int64_t n) {
    return static_cast<T*>(take(n * static_cast<int64_t>(sizeof(T))));
  }
  template <typename T>
  void download(T* host, const T* device, int64_t n) {
    copy_to_host(host, device, n * static_cast<int64_t>(sizeof(T)));
  }
  void finish();  // waits for the stream: the downloads are in host memory when it returns

 private:
  void* take(int64_t bytes);
  void copy_to_device(void* device, const void* host, int64_t bytes);
  void copy_to_host(void* host, const void* device, int64_t bytes);

  cudaStream_t stream_;
  std::vector<DeviceBytes> buffers_;
  size_t next_ = 0;
};

#if defined(__CUDACC__) || defined(TOUCHSTONE_CUDA_EMULATION)

// kernel<<<launch.blocks, launch.threads, 0, stream>>>(args...), nothing for an empty grid. One call
// site for every launch, so the CPU emulation (emulation/) runs the same kernels.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), const Launch& launch, cudaStream_t stream,
                   const Args&... args) {
  if (launch.blocks == 0) return;
#if defined(TOUCHSTONE_CUDA_EMULATION)
  (void)stream;
  emulation::run_grid(launch, [&] { kernel(args...); });
#else
  // clang-format reads a .cuh as C++ and would split the launch brackets.
  // clang-format off
  kernel<<<static_cast<unsigned>(launch.blocks), launch.threads, 0, stream>>>(args...);
  // clang-format on
#endif
}

// for (i = this thread's first element; i < n; i += all threads of the grid)
#define TOUCHSTONE_GRID_STRIDE_LOOP(i, n)                                                \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// The kernels' compute type: calls launch(double{}) in FP64 mode and launch(float{}) otherwise, so a
// launcher writes kernel<decltype(compute)> once for both (the CPU reference's T).
template <typename Launcher>
void with_compute_type(Precision precision, Launcher&& launch) {
  if (precision == Precision::kFp64) {
    launch(double{});
  } else {
    launch(float{});
  }
}

// combine(...) of `partial` over the kBlockThreads threads of the block, in the fixed tree order of
// launch.h; every thread gets the result. All threads of the block must call it.
template <typename T, typename Combine>
__device__ T block_reduce(T partial, Combine combine) {
  __shared__ T slots[kBlockThreads];
  slots[threadIdx.x] = partial;
  __syncthreads();
  for (int stride = kBlockThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      slots[threadIdx.x] = combine(slots[threadIdx.x], slots[threadIdx.x + stride]);
    __syncthreads();
  }
  const T result = slots[0];
  __syncthreads();  // the slots may be reused by the next call
  return result;
}

template <typename T>
__device__ T block_sum(T partial) {
  return block_reduce(partial, [](T a, T b) { return a + b; });
}

// Maximum over the block; exact, so the order does not matter.
template <typename T>
__device__ T block_max(T partial) {
  return block_reduce(partial, [](T a, T b) { return max(a, b); });
}

#endif

}  // namespace touchstone::cuda
