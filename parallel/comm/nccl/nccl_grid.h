// Grid::create's group maker for --comm nccl, without CUDA headers (defined only when the CUDA
// backend is built; parallel/comm/nccl/nccl_group.h has the group itself).
#pragma once

#include "parallel/comm/mpi_grid.h"

namespace touchstone {

// Collective over MPI_COMM_WORLD: picks this rank's GPU, device_for_local_rank(node_local_rank(),
// cuda_device_count()), and returns a maker of NcclProcessGroups on it whose unique ids come from
// ncclGetUniqueId.
GroupMaker nccl_group_maker();

}  // namespace touchstone
