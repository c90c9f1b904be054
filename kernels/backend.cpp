// Shared definitions of the kernel interface.
#include "kernels/backend.h"

#include <cmath>

#include "common/errors.h"
#include "kernels/attention_tiles.h"
#include "kernels/cpu/cpu_backend.h"
#if defined(TOUCHSTONE_HAVE_CUDA) || defined(TOUCHSTONE_CUDA_EMULATION)
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/launch.h"
#endif

namespace touchstone {

double AttentionShape::scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

void Backend::attention_forward(const double* q, const double* k, const double* v,
                                const int32_t* document_ids, bool document_masking,
                                const AttentionDropout& dropout, const AttentionShape& shape, double* out,
                                double* lse) {
  const WholeWindowBlock whole(document_ids, shape.windows, shape.seq);
  attention_block_forward(q, k, v, whole.block, document_masking, dropout, shape, out, lse);
}

void Backend::attention_backward(const double* dout, const double* q, const double* k, const double* v,
                                 const double* out, const double* lse, const int32_t* document_ids,
                                 bool document_masking, const AttentionDropout& dropout,
                                 const AttentionShape& shape, double* dq, double* dk, double* dv) {
  const WholeWindowBlock whole(document_ids, shape.windows, shape.seq);
  attention_block_backward(dout, q, k, v, out, lse, whole.block, document_masking, dropout, shape, dq, dk,
                           dv);
}

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

std::string backend_kind_name(BackendKind kind) { return kind == BackendKind::kCuda ? "cuda" : "cpu"; }

void require_cuda_device() {
#if defined(TOUCHSTONE_HAVE_CUDA) || defined(TOUCHSTONE_CUDA_EMULATION)
  cuda_device_count();  // throws InputError naming the cause when no GPU is usable
#else
  throw InputError(
      "this build has no CUDA backend (configure with -DTOUCHSTONE_CUDA=ON where nvcc, cuBLAS and NCCL are "
      "installed)");
#endif
}

void check_backend_available(BackendKind kind) {
  if (kind == BackendKind::kCuda) require_cuda_device();
}

std::string backend_description(BackendKind kind, int local_rank) {
  check_backend_available(kind);
#if defined(TOUCHSTONE_HAVE_CUDA) || defined(TOUCHSTONE_CUDA_EMULATION)
  if (kind == BackendKind::kCuda) {
    return "cuda (" + cuda_device_name(cuda::device_for_local_rank(local_rank, cuda_device_count())) + ")";
  }
#else
  (void)local_rank;
#endif
  return backend_kind_name(kind);
}

std::unique_ptr<Backend> make_backend(BackendKind kind, const BackendOptions& options, int local_rank) {
  check_backend_available(kind);
#if defined(TOUCHSTONE_HAVE_CUDA) || defined(TOUCHSTONE_CUDA_EMULATION)
  if (kind == BackendKind::kCuda) return make_cuda_backend(options, local_rank);
#else
  (void)local_rank;
#endif
  return make_cpu_backend(options);
}

}  // namespace touchstone
