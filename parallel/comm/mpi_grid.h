// How Grid::create builds a grid, private to parallel/: MPI_Comm_split of MPI_COMM_WORLD gives each
// group's members and communicator, and a group maker (one per communication backend) turns them into
// the ProcessGroup. Tests pass their own maker to watch what each group is made from.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/grid.h"
#include "parallel/comm/process_group.h"

namespace touchstone {

// One group of the grid, on this rank.
struct GroupMembers {
  std::string name;                          // "world", "tp", "dp", "pp", "embedding"
  MPI_Comm comm = MPI_COMM_NULL;             // ranks in group order; MPI_COMM_NULL for a group of one rank.
                                             // The group made from it owns it.
  std::vector<int> global_ranks;             // the world rank of each group rank
  int rank = 0;                              // this rank's group rank
  std::function<void(TransferRecord)> sink;  // the grid's record sink (ProcessGroup::set_record_sink)
};

// Called by every rank for world, tp, dp, pp and embedding, in that order, so a maker may run
// collectives over members.comm.
using GroupMaker = std::function<std::unique_ptr<ProcessGroup>(GroupMembers members)>;

// The --comm mpi maker: an MpiProcessGroup.
std::unique_ptr<ProcessGroup> make_mpi_group(GroupMembers members);

// Grid::create with every group from `make_group`: collective over MPI_COMM_WORLD, with the same
// checks (std::invalid_argument for a bad layout or a world of another size).
std::unique_ptr<Grid> create_grid(const GridLayout& layout, const GroupMaker& make_group);

}  // namespace touchstone
