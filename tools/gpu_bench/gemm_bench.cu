// touchstone-gemm-bench: the CUDA backend's GEMM configurations timed on device-resident operands
// against the GPU's peak, one JSON object per line (tools/gpu-check collects them for
// docs/BENCHMARKS.md).
//
//   fp64  cublasDgemm                                       (the FP64 oracle's GEMM)
//   bf16  cublasGemmEx, BF16 inputs, FP32 output, CUBLAS_COMPUTE_32F (the BF16 mode's GEMM)
//   fp32  cublasGemmEx, FP32, CUBLAS_COMPUTE_32F_PEDANTIC   (no TF32)
// The handle runs with CUBLAS_ATOMICS_NOT_ALLOWED, as the backend does, so these are the rates the
// deterministic configuration reaches. Peaks are the vendor's dense figures for the GPUs listed in
// peak_tflops(); another GPU prints null for the fraction.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "touchstone-gemm-bench: %s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

void check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "touchstone-gemm-bench: %s: %s\n", what, cublasGetStatusString(status));
  std::exit(1);
}

// Dense tensor-core peaks in TFLOP/s (NVIDIA data sheets, SXM parts), 0 when unknown.
double peak_tflops(const std::string& gpu, const std::string& precision) {
  struct Peak {
    const char* name;
    double fp64, fp32, bf16;
  };
  const Peak peaks[] = {
      {"H200", 67.0, 67.0, 989.0}, {"H100", 67.0, 67.0, 989.0}, {"A100", 19.5, 19.5, 312.0}};
  for (const Peak& p : peaks) {
    if (gpu.find(p.name) == std::string::npos) continue;
    return precision == "fp64" ? p.fp64 : precision == "fp32" ? p.fp32 : p.bf16;
  }
  return 0.0;
}

__global__ void fill(void* data, int64_t n, int element_bytes) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double value = static_cast<double>((i * 7919) % 1009) / 1009.0 - 0.5;
    if (element_bytes == 8) static_cast<double*>(data)[i] = value;
    if (element_bytes == 4) static_cast<float*>(data)[i] = static_cast<float>(value);
    if (element_bytes == 2)
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(static_cast<float>(value));
  }
}

void run(cublasHandle_t handle, const std::string& gpu, const std::string& precision, int n, int iterations) {
  const int input_bytes = precision == "fp64" ? 8 : precision == "fp32" ? 4 : 2;
  const int output_bytes = precision == "fp64" ? 8 : 4;
  const auto elements = static_cast<int64_t>(n) * n;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  check(cudaMalloc(&a, static_cast<size_t>(elements) * input_bytes), "cudaMalloc");
  check(cudaMalloc(&b, static_cast<size_t>(elements) * input_bytes), "cudaMalloc");
  check(cudaMalloc(&c, static_cast<size_t>(elements) * output_bytes), "cudaMalloc");
  fill<<<1024, 256>>>(a, elements, input_bytes);
  fill<<<1024, 256>>>(b, elements, input_bytes);
  const double alpha64 = 1.0, beta64 = 0.0;
  const float alpha32 = 1.0f, beta32 = 0.0f;
  auto gemm = [&] {
    if (precision == "fp64") {
      check(cublasDgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha64, static_cast<double*>(a), n,
                        static_cast<double*>(b), n, &beta64, static_cast<double*>(c), n),
            "cublasDgemm");
      return;
    }
    const cudaDataType_t type = precision == "bf16" ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        precision == "bf16" ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
    check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha32, a, type, n, b, type, n, &beta32,
                       c, CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  };
  gemm();  // warm-up: heuristics, clocks
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) gemm();
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float milliseconds = 0.0f;
  check(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime");
  const double seconds = static_cast<double>(milliseconds) / 1e3 / iterations;
  const double tflops = 2.0 * n * static_cast<double>(n) * n / seconds / 1e12;
  const double peak = peak_tflops(gpu, precision);
  char fraction[32] = "null";
  if (peak > 0.0) std::snprintf(fraction, sizeof fraction, "%.3f", tflops / peak);
  std::printf(
      "{\"gpu\": \"%s\", \"precision\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"seconds\": %.6e, "
      "\"tflops\": %.2f, \"peak_tflops\": %.1f, \"fraction_of_peak\": %s}\n",
      gpu.c_str(), precision.c_str(), n, n, n, seconds, tflops, peak, fraction);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf("usage: touchstone-gemm-bench [N ...]   (square sizes; default 1024 4096 8192)\n");
    return 0;
  }
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {1024, 4096, 8192};
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "touchstone-gemm-bench: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  cublasHandle_t handle = nullptr;
  check(cublasCreate(&handle), "cublasCreate");
  check(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
  for (const int n : sizes) {
    if (n <= 0) {
      std::fprintf(stderr, "touchstone-gemm-bench: size must be positive\n");
      return 2;
    }
    for (const char* precision : {"fp64", "fp32", "bf16"})
      run(handle, properties.name, precision, n, n >= 4096 ? 10 : 50);
  }
  cublasDestroy(handle);
  return 0;
}
