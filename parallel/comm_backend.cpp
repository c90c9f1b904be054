// Parsing and the up-front availability check of `--comm mpi|nccl`.
#include "parallel/comm_backend.h"

#include <string_view>

#include "model/errors.h"
#if defined(TOUCHSTONE_HAVE_CUDA)
#include "kernels/cuda/cuda_device.h"
#endif

namespace touchstone {

CommBackend parse_comm_backend(const std::string& name) {
  if (name == "mpi") return CommBackend::kMpi;
  if (name == "nccl") return CommBackend::kNccl;
  throw InputError("--comm: unknown value \"" + name + "\" (mpi, nccl)");
}

std::string comm_backend_name(CommBackend backend) { return backend == CommBackend::kNccl ? "nccl" : "mpi"; }

void check_comm_available(CommBackend backend) {
  if (backend == CommBackend::kMpi) return;
#if defined(TOUCHSTONE_HAVE_CUDA)
  try {
    cuda_device_count();
  } catch (const InputError& e) {
    // cuda_device_count() words its message for --backend cuda; the cause is the same for --comm nccl.
    std::string_view cause = e.what();
    constexpr std::string_view kBackendPrefix = "--backend cuda: ";
    if (cause.starts_with(kBackendPrefix)) cause.remove_prefix(kBackendPrefix.size());
    throw InputError("--comm nccl: " + std::string(cause));
  }
#else
  throw InputError(
      "--comm nccl: this build has no CUDA backend (configure with -DTOUCHSTONE_CUDA=ON where nvcc, cuBLAS "
      "and NCCL are installed)");
#endif
}

}  // namespace touchstone
