// The one matrix product of the CUDA backend, the device twin of kernels/cpu/gemm.h: the same
// arguments, on device pointers.
//
// FP64 calls cublasDgemm on the operands in place. FP32 and BF16 convert the operands (already FP32 or
// BF16 values held as double) exactly to float or __nv_bfloat16, call cublasGemmEx with an FP32
// compute type into an FP32 product, then round and store it (or add it to an FP32 accumulator) as
// the CPU reference does. FP32 runs with CUBLAS_COMPUTE_32F_PEDANTIC, which forbids TF32 and reduced-
// precision reductions; BF16 with CUBLAS_COMPUTE_32F, whose split-K partial sums are FP32 (docs/cuda.md).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cuda/device.cuh"

namespace touchstone::cuda {

// The converted operands and the FP32 product of lower-precision GEMMs (launch.h's GemmWorkspace).
struct GemmScratch {
  DeviceBytes a, b, product;
};

void gemm(cublasHandle_t handle, cudaStream_t stream, GemmScratch& scratch, Precision precision,
          cpu::RoundTo round_to, bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K,
          double alpha, const double* A, int64_t lda, const double* B, int64_t ldb, cpu::Store store,
          double* C, int64_t ldc);

}  // namespace touchstone::cuda
