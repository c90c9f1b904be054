// The CUDA backend's life cycle: the GPU, its stream and cuBLAS handle, and the factory.
#include <string>

#include "common/errors.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/cuda_device.h"

namespace touchstone {

namespace {

cudaStream_t stream_on(int device) {
  cuda::check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return stream;
}

}  // namespace

CudaBackend::CudaBackend(const BackendOptions& options, int device)
    : options_(options),
      rounding_{options.precision},
      device_(device),
      stream_(stream_on(device)),
      staging_(stream_) {
  cuda::check(cublasCreate(&cublas_), "cublasCreate");
  cuda::check(cublasSetStream(cublas_, stream_), "cublasSetStream");
  // Deterministic by construction: no kernel that reduces with atomics, and for FP32 no TF32.
  cuda::check(cublasSetAtomicsMode(cublas_, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
  cuda::check(cublasSetMathMode(cublas_,
                                precision() == Precision::kFp32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH),
              "cublasSetMathMode");
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

int cuda_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls report their own
    throw InputError(std::string("no CUDA device is usable (cudaGetDeviceCount: ") +
                     cudaGetErrorString(status) + ")");
  }
  if (count == 0) throw InputError("no CUDA device is visible to this process");
  return count;
}

std::string cuda_device_name(int device) {
  cudaDeviceProp properties{};
  cuda::check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return properties.name;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options, int local_rank) {
  const int device = cuda::device_for_local_rank(local_rank, cuda_device_count());
  return std::make_unique<CudaBackend>(options, device);
}

}  // namespace touchstone
