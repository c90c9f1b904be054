// Which library carries a grid's transfers (`--comm`): MPI on host buffers (the default, every build)
// or NCCL on one GPU per rank (CUDA builds; docs/communication.md#nccl). Both give the same bits.
#pragma once

#include <string>

namespace touchstone {

enum class CommBackend { kMpi, kNccl };

// "mpi" or "nccl"; anything else throws InputError naming the option and the choices.
CommBackend parse_comm_backend(const std::string& name);
std::string comm_backend_name(CommBackend backend);

// Throws the InputError that Grid::create would throw for `backend` on this process, without making
// anything: NCCL in a build without the CUDA backend, or with no GPU visible. Every rank calls it
// before the grid exists, so the ranks can agree to stop (exit 2) instead of failing one by one.
void check_comm_available(CommBackend backend);

}  // namespace touchstone
