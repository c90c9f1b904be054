// Which library carries a grid's transfers (`--comm`): MPI on host buffers (the default, every build)
// or NCCL on one GPU per rank (CUDA builds; docs/communication.md#nccl). Both give the same bits.
#pragma once

#include <string>

namespace touchstone {

enum class CommBackend { kMpi, kNccl };

std::string comm_backend_name(CommBackend backend);  // "mpi" or "nccl"

// Throws the InputError that Grid::create would throw for `backend` on this process, without making
// anything: NCCL in a build without the CUDA backend, or with no GPU visible. Every rank calls it
// before the grid exists, so the ranks can agree to stop (exit 2) instead of failing one by one. The
// message says why and names no option (a command line puts its flag in front).
void check_comm_available(CommBackend backend);

}  // namespace touchstone
