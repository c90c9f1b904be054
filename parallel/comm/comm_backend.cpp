// Parsing and the up-front availability check of `--comm mpi|nccl`.
#include "parallel/comm/comm_backend.h"

#include "common/errors.h"
#include "kernels/backend.h"

namespace touchstone {

CommBackend parse_comm_backend(const std::string& name) {
  if (name == "mpi") return CommBackend::kMpi;
  if (name == "nccl") return CommBackend::kNccl;
  throw InputError("--comm: unknown value \"" + name + "\" (mpi, nccl)");
}

std::string comm_backend_name(CommBackend backend) { return backend == CommBackend::kNccl ? "nccl" : "mpi"; }

void check_comm_available(CommBackend backend) {
  if (backend == CommBackend::kMpi) return;
#if defined(TOUCHSTONE_CUDA_EMULATION)
  throw InputError("--comm nccl: this build has no CUDA backend, only its CPU emulation, which has no NCCL");
#else
  require_cuda_device("--comm nccl");  // a build without CUDA says so
#endif
}

}  // namespace touchstone
