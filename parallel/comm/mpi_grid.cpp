// The process grid over MPI: create_grid splits MPI_COMM_WORLD into the tp, cp, dp, dp_cp, pp and
// embedding groups documented in grid.h and makes each with a backend's group maker (Grid::create, in
// comm_backend.cpp, picks the maker).
#include "parallel/comm/mpi_grid.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/mpi_group.h"
#if defined(TOUCHSTONE_HAVE_CUDA)
#endif

namespace touchstone {

GridLayout grid_layout(const ParallelConfig& parallel) {
  return GridLayout{static_cast<int>(parallel.tp), static_cast<int>(parallel.dp),
                    static_cast<int>(parallel.pp), static_cast<int>(parallel.cp)};
}

int rank_of(const GridLayout& layout, const GridCoordinates& coordinates) {
  return coordinates.tp_rank +
         layout.tp *
             (coordinates.cp_rank + layout.cp * (coordinates.dp_rank + layout.dp * coordinates.pp_rank));
}

GridCoordinates coordinates_of(const GridLayout& layout, int rank) {
  GridCoordinates coordinates;
  coordinates.tp_rank = rank % layout.tp;
  coordinates.cp_rank = (rank / layout.tp) % layout.cp;
  coordinates.dp_rank = (rank / (layout.tp * layout.cp)) % layout.dp;
  coordinates.pp_rank = rank / (layout.tp * layout.cp * layout.dp);
  return coordinates;
}

ProcessGroup& Grid::group(const std::string& name) {
  if (name == "world") return world();
  if (name == "tp") return tp();
  if (name == "cp") return cp();
  if (name == "dp") return dp();
  if (name == "dp_cp") return dp_cp();
  if (name == "pp") return pp();
  if (name == "embedding") return embedding();
  throw std::invalid_argument("no process group called '" + name +
                              "' (world, tp, cp, dp, dp_cp, pp, embedding)");
}

namespace {

class MpiGrid final : public Grid {
 public:
  MpiGrid(const GridLayout& layout, int rank, const GroupMaker& make_group) : Grid(layout, rank) {
    const GridCoordinates& c = coordinates();
    // Keying every split by world rank orders each group's ranks by their coordinate along it.
    // Each color numbers the coordinates the group's ranks share.
    world_ = make("world", 0, make_group);
    tp_ = make("tp", c.cp_rank + layout.cp * (c.dp_rank + layout.dp * c.pp_rank), make_group);
    cp_ = make("cp", c.tp_rank + layout.tp * (c.dp_rank + layout.dp * c.pp_rank), make_group);
    dp_ = make("dp", c.tp_rank + layout.tp * (c.cp_rank + layout.cp * c.pp_rank), make_group);
    dp_cp_ = make("dp_cp", c.tp_rank + layout.tp * c.pp_rank, make_group);
    const int pipeline = c.tp_rank + layout.tp * (c.cp_rank + layout.cp * c.dp_rank);
    pp_ = make("pp", pipeline, make_group);
    const bool embedding_stage = is_first_stage() || is_last_stage();
    embedding_ = make("embedding", embedding_stage ? pipeline : MPI_UNDEFINED, make_group);
  }

  ProcessGroup& world() override { return *world_; }
  ProcessGroup& tp() override { return *tp_; }
  ProcessGroup& cp() override { return *cp_; }
  ProcessGroup& dp() override { return *dp_; }
  ProcessGroup& dp_cp() override { return *dp_cp_; }
  ProcessGroup& pp() override { return *pp_; }
  ProcessGroup& embedding() override { return *embedding_; }

 private:
  // Collective over MPI_COMM_WORLD: every rank makes every group, in the same order. A rank that
  // passes MPI_UNDEFINED gets a group of itself alone, which needs no communicator.
  std::unique_ptr<ProcessGroup> make(const std::string& name, int color, const GroupMaker& make_group) {
    GroupMembers members;
    members.name = name;
    members.sink = [this](TransferRecord record) { this->record(std::move(record)); };
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, color, global_rank(), &comm);
    if (comm == MPI_COMM_NULL) {
      members.global_ranks = {global_rank()};
      return make_group(std::move(members));
    }
    int group_size = 0;
    MPI_Comm_rank(comm, &members.rank);
    MPI_Comm_size(comm, &group_size);
    members.global_ranks.resize(static_cast<size_t>(group_size));
    int me = global_rank();
    MPI_Allgather(&me, 1, MPI_INT, members.global_ranks.data(), 1, MPI_INT, comm);
    if (group_size == 1) {
      MPI_Comm_free(&comm);  // a group of one never communicates
      comm = MPI_COMM_NULL;
    }
    members.comm = comm;
    return make_group(std::move(members));
  }

  std::unique_ptr<ProcessGroup> world_, tp_, cp_, dp_, dp_cp_, pp_, embedding_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_group(GroupMembers members) {
  return std::make_unique<MpiProcessGroup>(std::move(members.name), members.comm,
                                           std::move(members.global_ranks), members.rank,
                                           std::move(members.sink));
}

std::unique_ptr<Grid> create_grid(const GridLayout& layout, const GroupMaker& make_group) {
  if (layout.tp < 1 || layout.cp < 1 || layout.dp < 1 || layout.pp < 1) {
    throw std::invalid_argument("grid layout tp, cp, dp and pp must all be at least 1");
  }
  int world_size = 0;
  int rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world_size != layout.world_size()) {
    throw std::invalid_argument("grid tp x cp x dp x pp = " + std::to_string(layout.world_size()) +
                                " ranks, but MPI started " + std::to_string(world_size));
  }
  return std::make_unique<MpiGrid>(layout, rank, make_group);
}

}  // namespace touchstone
