// The names and the up-front availability check of the communication backends.
#include "parallel/comm/comm_backend.h"

#include "common/errors.h"
#include "kernels/backend.h"

namespace touchstone {

std::string comm_backend_name(CommBackend backend) { return backend == CommBackend::kNccl ? "nccl" : "mpi"; }

void check_comm_available(CommBackend backend) {
  if (backend == CommBackend::kMpi) return;
#if defined(TOUCHSTONE_CUDA_EMULATION)
  throw InputError("this build has no CUDA backend, only its CPU emulation, which has no NCCL");
#else
  require_cuda_device();  // a build without CUDA says so
#endif
}

}  // namespace touchstone
