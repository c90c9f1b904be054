// The process grid: rank order, coordinates and the members of every group, for every layout the
// world size allows, checked against grid.h's formula and by a transfer inside each group.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/comm/grid.h"
#include "parallel/comm/mpi_runtime.h"
#include "tests/mpi/mpi_test.h"

namespace touchstone {
namespace {

using testing::MpiTest;

std::vector<int> members(ProcessGroup& group) {
  std::vector<int> ranks;
  for (int r = 0; r < group.size(); ++r) ranks.push_back(group.global_rank(r));
  return ranks;
}

// The group's members as MPI sees them: each rank contributes its global rank to an all_gather.
std::vector<int> members_by_transfer(ProcessGroup& group) {
  const double mine = static_cast<double>(testing::world_rank());
  std::vector<double> gathered(static_cast<size_t>(group.size()));
  group.all_gather(&mine, gathered.data(), 1, Shape{1});
  return std::vector<int>(gathered.begin(), gathered.end());
}

TEST(GridRankOrder, MatchesMegatronOrderOnTwoByTwoByTwo) {
  const GridLayout layout{2, 2, 2};
  // rank = tp + 2 * (dp + 2 * pp): tp neighbours are adjacent ranks.
  const int expected[8][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0},
                              {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};
  for (int rank = 0; rank < 8; ++rank) {
    const GridCoordinates c = coordinates_of(layout, rank);
    EXPECT_EQ(c.tp_rank, expected[rank][0]) << rank;
    EXPECT_EQ(c.dp_rank, expected[rank][1]) << rank;
    EXPECT_EQ(c.pp_rank, expected[rank][2]) << rank;
    EXPECT_EQ(rank_of(layout, c), rank);
  }
  const GridLayout deep{2, 1, 4};
  EXPECT_EQ(rank_of(deep, GridCoordinates{1, 0, 3}), 7);
  EXPECT_EQ(coordinates_of(deep, 5).pp_rank, 2);
}

TEST(GridRankOrder, ContextParallelRanksComeAfterTensorParallelOnes) {
  // tp = 2, cp = 2, dp = 2, pp = 2: rank = tp + 2 * (cp + 2 * (dp + 2 * pp)), Megatron-LM's order.
  const GridLayout layout{2, 2, 2, 2};
  EXPECT_EQ(layout.world_size(), 16);
  for (int rank = 0; rank < 16; ++rank) {
    const GridCoordinates c = coordinates_of(layout, rank);
    EXPECT_EQ(c.tp_rank, rank % 2) << rank;
    EXPECT_EQ(c.cp_rank, rank / 2 % 2) << rank;
    EXPECT_EQ(c.dp_rank, rank / 4 % 2) << rank;
    EXPECT_EQ(c.pp_rank, rank / 8) << rank;
    EXPECT_EQ(rank_of(layout, c), rank);
  }
}

class GridTest : public MpiTest {};

TEST_F(GridTest, CoordinatesAndGroupsForEveryLayout) {
  const int rank = testing::world_rank();
  const int n = testing::world_size();
  for (const GridLayout& layout : testing::layouts_of_world()) {
    SCOPED_TRACE(testing::describe(layout));
    std::unique_ptr<Grid> grid = Grid::create(layout);
    const GridCoordinates c = grid->coordinates();
    EXPECT_EQ(grid->global_rank(), rank);
    EXPECT_EQ(rank_of(layout, c), rank);
    EXPECT_EQ(grid->is_first_stage(), c.pp_rank == 0);
    EXPECT_EQ(grid->is_last_stage(), c.pp_rank == layout.pp - 1);

    std::vector<int> world, tp, cp, dp, dp_cp, pp;
    for (int r = 0; r < n; ++r) world.push_back(r);
    for (int t = 0; t < layout.tp; ++t) tp.push_back(rank_of(layout, {t, c.dp_rank, c.pp_rank, c.cp_rank}));
    for (int x = 0; x < layout.cp; ++x) cp.push_back(rank_of(layout, {c.tp_rank, c.dp_rank, c.pp_rank, x}));
    for (int d = 0; d < layout.dp; ++d) dp.push_back(rank_of(layout, {c.tp_rank, d, c.pp_rank, c.cp_rank}));
    for (int d = 0; d < layout.dp; ++d) {  // dp_cp: cp fastest, as in rank order
      for (int x = 0; x < layout.cp; ++x) dp_cp.push_back(rank_of(layout, {c.tp_rank, d, c.pp_rank, x}));
    }
    for (int p = 0; p < layout.pp; ++p) pp.push_back(rank_of(layout, {c.tp_rank, c.dp_rank, p, c.cp_rank}));
    // Tied embeddings: the first and last stage of this pp group; everyone else is alone.
    std::vector<int> embedding{rank};
    if (layout.pp > 1 && (grid->is_first_stage() || grid->is_last_stage())) {
      embedding = {rank_of(layout, {c.tp_rank, c.dp_rank, 0, c.cp_rank}),
                   rank_of(layout, {c.tp_rank, c.dp_rank, layout.pp - 1, c.cp_rank})};
    }
    const struct {
      const char* name;
      ProcessGroup& group;
      std::vector<int> expected;
      int expected_rank;
    } cases[] = {
        {"world", grid->world(), world, rank},
        {"tp", grid->tp(), tp, c.tp_rank},
        {"cp", grid->cp(), cp, c.cp_rank},
        {"dp", grid->dp(), dp, c.dp_rank},
        {"dp_cp", grid->dp_cp(), dp_cp, c.dp_rank * layout.cp + c.cp_rank},
        {"pp", grid->pp(), pp, c.pp_rank},
        {"embedding", grid->embedding(), embedding, embedding.size() == 2 && grid->is_last_stage() ? 1 : 0},
    };
    for (const auto& expectation : cases) {
      SCOPED_TRACE(expectation.name);
      EXPECT_EQ(expectation.group.name(), expectation.name);
      EXPECT_EQ(&grid->group(expectation.name), &expectation.group);
      EXPECT_EQ(expectation.group.size(), static_cast<int>(expectation.expected.size()));
      EXPECT_EQ(expectation.group.rank(), expectation.expected_rank);
      EXPECT_EQ(members(expectation.group), expectation.expected);
      EXPECT_EQ(members_by_transfer(expectation.group), expectation.expected);
    }
  }
}

TEST_F(GridTest, RejectsALayoutThatDoesNotMatchTheWorld) {
  const int n = testing::world_size();
  EXPECT_THROW(Grid::create(GridLayout{n + 1, 1, 1}), std::invalid_argument);
  EXPECT_THROW(Grid::create(GridLayout{0, n, 1}), std::invalid_argument);
  std::unique_ptr<Grid> grid = Grid::create(GridLayout{1, n, 1});
  EXPECT_THROW(grid->group("ep"), std::invalid_argument);
}

TEST_F(GridTest, RuntimeReportsTheWorld) {
  MpiRuntime nested;  // MPI is already running: this one must neither initialise nor finalise it
  EXPECT_EQ(nested.world_rank(), testing::world_rank());
  EXPECT_EQ(nested.world_size(), testing::world_size());
}

}  // namespace
}  // namespace touchstone
