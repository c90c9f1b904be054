// The names and the up-front availability check of the communication backends, and Grid::create,
// the one place that picks a backend's group maker (MPI, or NCCL on top of MPI's communicators).
#include "parallel/comm/comm_backend.h"

#include "common/errors.h"
#include "kernels/backend.h"
#include "parallel/comm/mpi_grid.h"
#include "parallel/comm/nccl/nccl_grid.h"

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

std::unique_ptr<Grid> Grid::create(const GridLayout& layout, CommBackend comm) {
  check_comm_available(comm);
#if defined(TOUCHSTONE_HAVE_CUDA)
  if (comm == CommBackend::kNccl) return create_grid(layout, nccl_group_maker());
#endif
  return create_grid(layout, make_mpi_group);
}

}  // namespace touchstone
