// The CPU emulation of the CUDA runtime and cuBLAS calls the backend uses (cuda_runtime.h here).
//
// Fibers: each of the kBlockThreads emulated threads runs on its own stack, made once with
// makecontext. Switching between a fiber and the scheduler uses _setjmp/_longjmp (13 ns here, against
// 330 ns for swapcontext, which makes a system call to save the signal mask), so a block's barrier
// costs about 2 x 256 switches.
#undef _FORTIFY_SOURCE  // its longjmp check refuses the jump between stacks that fibers are made of
#include "kernels/cuda/emulation/emulator.h"

#include <setjmp.h>
#include <ucontext.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/emulation/cublas_v2.h"
#include "kernels/cuda/emulation/cuda_runtime.h"

namespace touchstone::cuda::emulation {
namespace {

constexpr size_t kStackBytes = 256 * 1024;

struct Fiber {
  ucontext_t context{};
  jmp_buf resume{};
  std::vector<char> stack = std::vector<char>(kStackBytes);
  bool started = false;
  bool done = false;  // finished the current block
};

struct Scheduler {
  std::vector<Fiber> fibers = std::vector<Fiber>(kBlockThreads);
  jmp_buf back{};  // where a yielding fiber returns to
  const std::function<void()>* thread = nullptr;
  int current = 0;
};

Scheduler& scheduler() {
  static Scheduler instance;
  return instance;
}

void yield_to_scheduler() {
  Scheduler& s = scheduler();
  if (_setjmp(s.fibers[static_cast<size_t>(s.current)].resume) == 0) _longjmp(s.back, 1);
}

// A fiber's whole life: run the current kernel's thread body, report done, wait for the next block.
void fiber_main() {
  for (;;) {
    Scheduler& s = scheduler();
    (*s.thread)();
    s.fibers[static_cast<size_t>(s.current)].done = true;
    yield_to_scheduler();
  }
}

void resume(int t) {
  Scheduler& s = scheduler();
  Fiber& fiber = s.fibers[static_cast<size_t>(t)];
  s.current = t;
  threadIdx.x = static_cast<unsigned>(t);
  if (_setjmp(s.back) != 0) return;  // the fiber yielded or finished
  if (!fiber.started) {
    fiber.started = true;
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack.data();
    fiber.context.uc_stack.ss_size = fiber.stack.size();
    fiber.context.uc_link = nullptr;  // fiber_main never returns
    makecontext(&fiber.context, fiber_main, 0);
    ucontext_t unused;
    swapcontext(&unused, &fiber.context);
  }
  _longjmp(fiber.resume, 1);
}

}  // namespace

void run_grid(const Launch& launch, const std::function<void()>& thread) {
  if (launch.threads != kBlockThreads)
    throw std::invalid_argument("emulated launch: blocks must have 256 threads");
  Scheduler& s = scheduler();
  s.thread = &thread;
  blockDim = {static_cast<unsigned>(launch.threads), 1, 1};
  gridDim = {static_cast<unsigned>(launch.blocks), 1, 1};
  for (int64_t block = 0; block < launch.blocks; ++block) {
    blockIdx = {static_cast<unsigned>(block), 0, 0};
    for (Fiber& fiber : s.fibers) fiber.done = false;
    bool waiting = true;
    while (waiting) {  // one round: every unfinished thread runs to its next barrier or its end
      waiting = false;
      for (int t = 0; t < kBlockThreads; ++t) {
        if (s.fibers[static_cast<size_t>(t)].done) continue;
        resume(t);
        waiting = waiting || !s.fibers[static_cast<size_t>(t)].done;
      }
    }
  }
  threadIdx = blockIdx = {};
}

}  // namespace touchstone::cuda::emulation

void __syncthreads() { touchstone::cuda::emulation::yield_to_scheduler(); }

// ---- the runtime: device memory is host memory, every call completes before it returns ----------

struct EmulatedStream {};
struct EmulatedBlasHandle {};

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
  }
  return "unknown error";
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  if (device != 0) return cudaErrorInvalidValue;
  std::strncpy(properties->name, "CPU emulation", sizeof properties->name);
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  *pointer = std::malloc(bytes);
  return *pointer != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* pointer) {
  std::free(pointer);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t bytes, cudaMemcpyKind /*kind*/,
                            cudaStream_t /*stream*/) {
  std::memmove(destination, source, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned /*flags*/) {
  *stream = new EmulatedStream;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t /*stream*/) { return cudaSuccess; }

// ---- cuBLAS: column-major C = alpha op(A) op(B) + beta C ---------------------------------------------

namespace {

// Element (row, column) of op(M) for a column-major M with leading dimension ld.
double element(const void* m, cudaDataType_t type, bool transpose, int64_t row, int64_t column, int ld) {
  const int64_t at = transpose ? column + row * ld : row + column * ld;
  if (type == CUDA_R_16BF)
    return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(m)[at]));
  if (type == CUDA_R_32F) return static_cast<double>(static_cast<const float*>(m)[at]);
  return static_cast<const double*>(m)[at];
}

// Sums in Accumulate (double for DGEMM, float for the 32F compute types), k in ascending order.
template <typename Accumulate, typename Out>
void column_major_gemm(bool ta, bool tb, int m, int n, int k, Accumulate alpha, const void* A,
                       cudaDataType_t a_type, int lda, const void* B, cudaDataType_t b_type, int ldb,
                       Accumulate beta, Out* C, int ldc) {
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      Accumulate sum = 0;
      for (int p = 0; p < k; ++p) {
        sum += static_cast<Accumulate>(element(A, a_type, ta, i, p, lda)) *
               static_cast<Accumulate>(element(B, b_type, tb, p, j, ldb));
      }
      Out& c = C[static_cast<int64_t>(i) + static_cast<int64_t>(j) * ldc];
      c = beta == Accumulate(0) ? static_cast<Out>(alpha * sum) : static_cast<Out>(alpha * sum + beta * c);
    }
  }
}

}  // namespace

const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}
cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new EmulatedBlasHandle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetAtomicsMode(cublasHandle_t, cublasAtomicsMode_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasDgemm(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const double* alpha, const double* A, int lda, const double* B, int ldb,
                           const double* beta, double* C, int ldc) {
  column_major_gemm<double, double>(transa == CUBLAS_OP_T, transb == CUBLAS_OP_T, m, n, k, *alpha, A,
                                    CUDA_R_64F, lda, B, CUDA_R_64F, ldb, *beta, C, ldc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType_t a_type, int lda,
                            const void* B, cudaDataType_t b_type, int ldb, const void* beta, void* C,
                            cudaDataType_t c_type, int ldc, cublasComputeType_t, cublasGemmAlgo_t) {
  if (c_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;  // the backend's GEMMs write FP32
  column_major_gemm<float, float>(transa == CUBLAS_OP_T, transb == CUBLAS_OP_T, m, n, k,
                                  *static_cast<const float*>(alpha), A, a_type, lda, B, b_type, ldb,
                                  *static_cast<const float*>(beta), static_cast<float*>(C), ldc);
  return CUBLAS_STATUS_SUCCESS;
}
