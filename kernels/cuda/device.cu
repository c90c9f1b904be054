// Error checks, device buffers and the operand staging of the CUDA backend (kernels/cuda/device.cuh).
#include <stdexcept>
#include <string>

#include "kernels/cuda/device.cuh"

namespace touchstone::cuda {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string("cuBLAS ") + what + ": " + cublasGetStatusString(status));
}

void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

DeviceBytes::~DeviceBytes() {
  if (data_ != nullptr) cudaFree(data_);  // nothing to report from a destructor
}

DeviceBytes::DeviceBytes(DeviceBytes&& other) noexcept : data_(other.data_), capacity_(other.capacity_) {
  other.data_ = nullptr;
  other.capacity_ = 0;
}

void* DeviceBytes::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  if (data_ != nullptr) {
    // Work queued earlier in the same operator call (a GEMM reading its converted operands) may still
    // read the old buffer; growing is rare (the first calls of a run), so waiting costs nothing.
    check(cudaDeviceSynchronize(), "synchronize before growing a buffer");
    check(cudaFree(data_), "cudaFree");
  }
  data_ = nullptr;
  capacity_ = 0;
  check(cudaMalloc(&data_, bytes == 0 ? 1 : bytes),
        ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  capacity_ = bytes;
  return data_;
}

void* Staging::take(int64_t bytes) {
  if (next_ == buffers_.size()) buffers_.emplace_back();
  return buffers_[next_++].reserve(static_cast<size_t>(bytes));
}

void Staging::copy_to_device(void* device, const void* host, int64_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(device, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_),
        "copy to device");
}

void Staging::copy_to_host(void* host, const void* device, int64_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(host, device, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_),
        "copy to host");
}

void Staging::finish() { check(cudaStreamSynchronize(stream_), "stream synchronize"); }

}  // namespace touchstone::cuda
