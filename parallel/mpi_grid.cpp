// The process grid over MPI: rank arithmetic and Grid::create, which splits MPI_COMM_WORLD into the
// tp, dp, pp and embedding groups documented in grid.h.
#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/grid.h"
#include "parallel/mpi_group.h"

namespace touchstone {

int rank_of(const GridLayout& layout, const GridCoordinates& coordinates) {
  return coordinates.tp_rank + layout.tp * (coordinates.dp_rank + layout.dp * coordinates.pp_rank);
}

GridCoordinates coordinates_of(const GridLayout& layout, int rank) {
  GridCoordinates coordinates;
  coordinates.tp_rank = rank % layout.tp;
  coordinates.dp_rank = (rank / layout.tp) % layout.dp;
  coordinates.pp_rank = rank / (layout.tp * layout.dp);
  return coordinates;
}

ProcessGroup& Grid::group(const std::string& name) {
  if (name == "world") return world();
  if (name == "tp") return tp();
  if (name == "dp") return dp();
  if (name == "pp") return pp();
  if (name == "embedding") return embedding();
  throw std::invalid_argument("no process group called '" + name + "' (world, tp, dp, pp, embedding)");
}

namespace {

class MpiGrid final : public Grid {
 public:
  MpiGrid(const GridLayout& layout, int rank) : Grid(layout, rank) {
    const GridCoordinates& c = coordinates();
    // Keying every split by world rank orders each group's ranks by their coordinate along it.
    world_ = make_group("world", 0);
    tp_ = make_group("tp", c.dp_rank + layout.dp * c.pp_rank);
    dp_ = make_group("dp", c.tp_rank + layout.tp * c.pp_rank);
    pp_ = make_group("pp", c.tp_rank + layout.tp * c.dp_rank);
    const bool embedding_stage = is_first_stage() || is_last_stage();
    embedding_ = make_group("embedding", embedding_stage ? c.tp_rank + layout.tp * c.dp_rank : MPI_UNDEFINED);
  }

  ProcessGroup& world() override { return *world_; }
  ProcessGroup& tp() override { return *tp_; }
  ProcessGroup& dp() override { return *dp_; }
  ProcessGroup& pp() override { return *pp_; }
  ProcessGroup& embedding() override { return *embedding_; }

 private:
  // Collective over MPI_COMM_WORLD: every rank makes every group, in the same order. A rank that
  // passes MPI_UNDEFINED gets a group of itself alone, which needs no communicator.
  std::unique_ptr<MpiProcessGroup> make_group(const std::string& name, int color) {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, color, global_rank(), &comm);
    auto sink = [this](TransferRecord record) { this->record(std::move(record)); };
    if (comm == MPI_COMM_NULL) {
      return std::make_unique<MpiProcessGroup>(name, MPI_COMM_NULL, std::vector<int>{global_rank()}, 0, sink);
    }
    int group_rank = 0;
    int group_size = 0;
    MPI_Comm_rank(comm, &group_rank);
    MPI_Comm_size(comm, &group_size);
    std::vector<int> global_ranks(static_cast<size_t>(group_size));
    int me = global_rank();
    MPI_Allgather(&me, 1, MPI_INT, global_ranks.data(), 1, MPI_INT, comm);
    if (group_size == 1) {
      MPI_Comm_free(&comm);  // a group of one never calls MPI
      comm = MPI_COMM_NULL;
    }
    return std::make_unique<MpiProcessGroup>(name, comm, std::move(global_ranks), group_rank, sink);
  }

  std::unique_ptr<MpiProcessGroup> world_, tp_, dp_, pp_, embedding_;
};

}  // namespace

std::unique_ptr<Grid> Grid::create(const GridLayout& layout) {
  if (layout.tp < 1 || layout.dp < 1 || layout.pp < 1) {
    throw std::invalid_argument("grid layout tp, dp and pp must all be at least 1");
  }
  int world_size = 0;
  int rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world_size != layout.world_size()) {
    throw std::invalid_argument("grid tp x dp x pp = " + std::to_string(layout.world_size()) +
                                " ranks, but MPI started " + std::to_string(world_size));
  }
  return std::make_unique<MpiGrid>(layout, rank);
}

}  // namespace touchstone
