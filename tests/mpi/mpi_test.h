// Shared pieces of the MPI tests: a fixture that makes every rank agree on each test's outcome, and
// the grid layouts a world of this size can hold.
//
// Every rank runs every test, and a test's collectives must be reached by every rank of the group,
// so tests use EXPECT (which keeps going) around collectives, and ASSERT only where all ranks
// would stop at the same point.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/grid.h"

namespace touchstone::testing {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// A failure on rank 3 alone is printed by rank 3 only; TearDown makes rank 0's summary (and exit
// status) fail too, naming the ranks, so the run is never reported green by the rank that passed.
class MpiTest : public ::testing::Test {
 protected:
  void TearDown() override {
    const int failed = HasFailure() ? 1 : 0;
    std::vector<int> all(static_cast<size_t>(world_size()));
    MPI_Gather(&failed, 1, MPI_INT, all.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (world_rank() != 0) return;
    std::string ranks;
    for (size_t r = 1; r < all.size(); ++r) {
      if (all[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!ranks.empty()) ADD_FAILURE() << "failed on rank(s) " << ranks << " (their messages are above)";
  }
};

// Every (tp, cp, dp, pp) whose product is the world size.
inline std::vector<GridLayout> layouts_of_world() {
  const int n = world_size();
  std::vector<GridLayout> layouts;
  for (int tp = 1; tp <= n; ++tp) {
    for (int cp = 1; tp * cp <= n; ++cp) {
      for (int dp = 1; tp * cp * dp <= n; ++dp) {
        if (n % (tp * cp * dp) == 0) layouts.push_back(GridLayout{tp, dp, n / (tp * cp * dp), cp});
      }
    }
  }
  return layouts;
}

inline std::string describe(const GridLayout& layout) {
  return "tp" + std::to_string(layout.tp) + " cp" + std::to_string(layout.cp) + " dp" +
         std::to_string(layout.dp) + " pp" + std::to_string(layout.pp);
}

}  // namespace touchstone::testing

namespace touchstone::testing {

// Runs `check` on every group (world, tp, cp, dp, dp_cp, pp, embedding) of every layout of this world, so
// groups of one rank, groups of neighbours and strided groups are all exercised.
template <typename Check>
void for_every_group(Check check) {
  for (const GridLayout& layout : layouts_of_world()) {
    std::unique_ptr<Grid> grid = Grid::create(layout);
    for (const char* name : {"world", "tp", "cp", "dp", "dp_cp", "pp", "embedding"}) {
      SCOPED_TRACE(describe(layout) + " group " + name);
      check(grid->group(name));
    }
  }
}

// Element counts that hit the edge cases of chunking: empty, fewer than the ranks, not a multiple.
inline std::vector<int64_t> counts_for(int group_size) { return {0, 1, group_size + 1, 37, 1000}; }

}  // namespace touchstone::testing
