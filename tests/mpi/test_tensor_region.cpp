// TensorParallelRegion (parallel/tensor/regions.h) on its own, at tp = 2 and tp = 4 (with and without
// data-parallel replicas beside the tp groups), with and without sequence parallelism. It proves:
//   - local_rows / first_local_row: each rank's block of rows with sequence parallelism, all rows without;
//   - gather: the identity without sequence parallelism (no transfer at all), the rank-ordered
//     concatenation of the blocks with it;
//   - reduce: the sum of every rank's partial sums, whole (all-reduce) or this rank's block of rows
//     (reduce-scatter), exactly equal in FP64 to a closed-form expectation;
//   - in BF16 the reduced sum is stored as an activation: the FP64 sum rounded once to FP32 and then to
//     BF16 (nearest even), as a BF16 all-reduce delivers it;
//   - the conjugate pair: reduce is the adjoint (the backward) of gather and gather that of reduce,
//     checked by the dot-product identity sum_r <G(x)_r, y_r> = sum_r <x_r, R(y)_r>, where a replicated
//     tensor is counted once.
// Every input is a small integer (or a BF16 value whose sums the test rounds itself), so each FP64
// result is exact in any summation order and compared bitwise.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "parallel/tensor/regions.h"
#include "tests/mpi/mpi_test.h"
#include "tests/unit/test_rounding_reference.h"

namespace touchstone {
namespace {

using testing::MpiTest;

ActivationBuffer as_buffer(const std::vector<double>& values) { return {values.begin(), values.end()}; }

class TensorRegionTest : public MpiTest {};

constexpr int64_t kRows = 12;  // divisible by every tp size tested (2 and 4)
constexpr int64_t kCols = 5;

// Runs `check` with the tp group of every layout of this world whose tp size is above 1: tp = world,
// and tp = 2 with the other ranks as data-parallel replicas (world 4), whose tp groups must not mix.
void for_every_tp_group(const std::function<void(const Grid&, ProcessGroup&)>& check) {
  const int n = testing::world_size();
  std::vector<int> tp_sizes{n};
  if (n > 2 && n % 2 == 0) tp_sizes.push_back(2);
  for (int tp : tp_sizes) {
    if (tp < 2) continue;
    std::unique_ptr<Grid> grid = Grid::create(GridLayout{tp, n / tp, 1});
    SCOPED_TRACE(testing::describe(grid->layout()));
    check(*grid, grid->tp());
  }
}

// Runs `check` on a region of every tp group of for_every_tp_group, without and with sequence
// parallelism, with the replica (dp rank) whose inputs the check draws.
void for_every_region(
    Backend& backend,
    const std::function<void(const Grid&, ProcessGroup&, const TensorParallelRegion&, int)>& check) {
  for_every_tp_group([&](const Grid& grid, ProcessGroup& tp) {
    for (bool sequence_parallel : {false, true}) {
      SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "plain tp");
      const TensorParallelRegion region(tp, sequence_parallel, backend);
      check(grid, tp, region, grid.coordinates().dp_rank);
    }
  });
}

// Distinct small integers for (replica, tp rank, row, column), so a block from the wrong rank, row or
// replica changes the value; at most 8 in magnitude, so their sums and dot products are exact in FP64.
double entry(int replica, int rank, int64_t row, int64_t col) {
  return static_cast<double>(((replica * 7 + rank * 5 + row * 3 + col) % 17) - 8);
}

// rows x cols of entry(replica, rank, first_row + i, c).
ActivationBuffer block(int replica, int rank, int64_t first_row, int64_t rows) {
  ActivationBuffer values(static_cast<size_t>(rows * kCols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < kCols; ++c)
      values[static_cast<size_t>(i * kCols + c)] = entry(replica, rank, first_row + i, c);
  }
  return values;
}

TEST_F(TensorRegionTest, LocalRowsAreOneBlockPerRankWithSequenceParallelism) {
  auto backend = make_cpu_backend();
  for_every_tp_group([&](const Grid&, ProcessGroup& tp) {
    const TensorParallelRegion plain(tp, false, *backend), sequence(tp, true, *backend);
    EXPECT_EQ(plain.tp_size(), tp.size());
    EXPECT_EQ(plain.tp_rank(), tp.rank());
    EXPECT_FALSE(plain.sequence_parallel());
    EXPECT_TRUE(sequence.sequence_parallel());
    EXPECT_EQ(&plain.group(), &tp);
    EXPECT_EQ(plain.local_rows(kRows), kRows);
    EXPECT_EQ(plain.first_local_row(kRows), 0);
    EXPECT_EQ(sequence.local_rows(kRows), kRows / tp.size());
    EXPECT_EQ(sequence.first_local_row(kRows), tp.rank() * (kRows / tp.size()));
  });
}

TEST_F(TensorRegionTest, GatherWithoutSequenceParallelismIsTheIdentity) {
  auto backend = make_cpu_backend();
  for_every_tp_group([&](const Grid& grid, ProcessGroup& tp) {
    const TensorParallelRegion region(tp, false, *backend);
    const ActivationBuffer local = block(grid.coordinates().dp_rank, tp.rank(), 0, kRows);
    const int64_t calls_before = tp.counts().total_calls();
    ActivationBuffer full;
    region.gather(local, kRows, kCols, full);
    EXPECT_EQ(full, local);
    EXPECT_EQ(tp.counts().total_calls(), calls_before) << "the identity must not transfer anything";
  });
}

TEST_F(TensorRegionTest, GatherWithSequenceParallelismConcatenatesTheBlocksInRankOrder) {
  auto backend = make_cpu_backend();
  for_every_tp_group([&](const Grid& grid, ProcessGroup& tp) {
    const TensorParallelRegion region(tp, true, *backend);
    const int replica = grid.coordinates().dp_rank;
    const int64_t local_rows = region.local_rows(kRows);
    // Rank r holds rows [r L, (r + 1) L) of the full tensor, row i being entry(replica, 0, i, c).
    const ActivationBuffer local = block(replica, 0, region.first_local_row(kRows), local_rows);
    ActivationBuffer full;
    region.gather(local, kRows, kCols, full);
    EXPECT_EQ(full, block(replica, 0, 0, kRows));
  });
}

// The closed form of sum over tp ranks r of entry(replica, r, row, c), written without the reduction
// order: the integers are exact, so any order gives these bits.
ActivationBuffer sum_over_ranks(int replica, int tp_size, int64_t first_row, int64_t rows) {
  ActivationBuffer sum(static_cast<size_t>(rows * kCols), 0.0);
  for (int r = 0; r < tp_size; ++r) {
    const ActivationBuffer part = block(replica, r, first_row, rows);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  return sum;
}

TEST_F(TensorRegionTest, ReduceSumsThePartialSumsWholeOrThisRanksBlock) {
  auto backend = make_cpu_backend();
  for_every_region(*backend,
                   [&](const Grid&, ProcessGroup& tp, const TensorParallelRegion& region, int replica) {
                     ActivationBuffer partial = block(replica, tp.rank(), 0, kRows), local;
                     region.reduce(partial, kRows, kCols, local);
                     const int64_t first = region.first_local_row(kRows), rows = region.local_rows(kRows);
                     EXPECT_EQ(local, sum_over_ranks(replica, tp.size(), first, rows));
                   });
}

TEST_F(TensorRegionTest, Bf16ReduceRoundsTheSumOnceThroughFp32) {
  auto bf16_backend = make_cpu_backend(BackendOptions{Precision::kBf16});
  for_every_tp_group([&](const Grid& grid, ProcessGroup& tp) {
    const auto seed_of = [&](int rank) {
      return static_cast<uint32_t>(100 * grid.coordinates().dp_rank + rank);
    };
    for (bool sequence_parallel : {false, true}) {
      SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "plain tp");
      const TensorParallelRegion region(tp, sequence_parallel, *bf16_backend);
      // Each rank's partial sums are BF16 values (the output of a BF16 GEMM); their sum needs more bits.
      ActivationBuffer partial = as_buffer(testing::bf16_values(kRows * kCols, 3.0, seed_of(tp.rank()))),
                       local;
      region.reduce(partial, kRows, kCols, local);

      const int64_t first = region.first_local_row(kRows) * kCols;
      ActivationBuffer exact(static_cast<size_t>(kRows * kCols), 0.0);
      for (int r = 0; r < tp.size(); ++r) {
        const ActivationBuffer part = as_buffer(testing::bf16_values(kRows * kCols, 3.0, seed_of(r)));
        for (size_t i = 0; i < exact.size(); ++i) exact[i] += part[i];  // exact: few BF16 terms
      }
      if (local.size() != static_cast<size_t>(region.local_rows(kRows) * kCols)) {
        ADD_FAILURE() << "reduce returned " << local.size() << " elements";  // no ASSERT: ranks stay in step
        continue;
      }
      int rounded = 0, nearest_not_truncated = 0;
      for (size_t i = 0; i < local.size(); ++i) {
        const double sum = exact[static_cast<size_t>(first) + i];
        const auto as_fp32 = static_cast<float>(sum);
        EXPECT_EQ(local[i], testing::bf16(as_fp32)) << "element " << i << " sum " << sum;
        rounded += testing::bf16(as_fp32) != sum ? 1 : 0;
        nearest_not_truncated += testing::bf16(as_fp32) != testing::bf16_truncated(as_fp32) ? 1 : 0;
      }
      // The inputs must make the rounding visible: a dropped or truncating rounding would fail above.
      EXPECT_GT(rounded, 0);
      EXPECT_GT(nearest_not_truncated, 0);
    }
  });
}

// The sum of `local` over this rank's tp group (the ranks of the world with its dp coordinate), added
// in rank order; the values here are exact integers, so the order does not matter.
double sum_over_tp_group(const Grid& grid, double local) {
  const int n = testing::world_size();
  ActivationBuffer all(static_cast<size_t>(n));
  MPI_Allgather(&local, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  double total = 0.0;
  for (int r = 0; r < n; ++r) {
    if (coordinates_of(grid.layout(), r).dp_rank == grid.coordinates().dp_rank)
      total += all[static_cast<size_t>(r)];
  }
  return total;
}

double dot(const ActivationBuffer& a, const ActivationBuffer& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// With a replicated tensor (plain tp) every rank holds the same copy, which is one tensor: its dot
// product is counted once, on this rank. A sharded one (sequence parallel) is the sum over the group.
double dot_of_region_tensor(const Grid& grid, bool sequence_parallel, const ActivationBuffer& a,
                            const ActivationBuffer& b) {
  return sequence_parallel ? sum_over_tp_group(grid, dot(a, b)) : dot(a, b);
}

TEST_F(TensorRegionTest, ReduceIsTheBackwardOfGatherAndGatherOfReduce) {
  auto backend = make_cpu_backend();
  for_every_region(
      *backend, [&](const Grid& grid, ProcessGroup& tp, const TensorParallelRegion& region, int replica) {
        const bool sequence_parallel = region.sequence_parallel();
        const int64_t rows = region.local_rows(kRows), first = region.first_local_row(kRows);
        const int shard_rank = sequence_parallel ? tp.rank() : 0;  // plain tp: the same tensor everywhere

        // Gather G: x (the region's input, held as the residual stream is) -> the full tensor on every
        // rank; y_r: rank r's partial gradient of that full tensor. sum_r <G(x)_r, y_r> = <x, R(y)>.
        const ActivationBuffer x = block(replica, shard_rank, first, rows);
        const ActivationBuffer y = block(replica + 3, tp.rank() + 1, 0, kRows);
        ActivationBuffer gathered_x, y_consumed = y, reduced_y;
        region.gather(x, kRows, kCols, gathered_x);
        region.reduce(y_consumed, kRows, kCols, reduced_y);
        const double through_gather = sum_over_tp_group(grid, dot(gathered_x, y));
        EXPECT_EQ(through_gather, dot_of_region_tensor(grid, sequence_parallel, x, reduced_y))
            << "the backward of gather is not reduce";
        EXPECT_NE(through_gather, 0.0);  // an identity between zeros would prove nothing

        // Reduce R: p_r (rank r's partial sums) -> the sum, held as the residual stream is; z: the
        // gradient of that sum. <R(p), z> = sum_r <p_r, G(z)_r>.
        const ActivationBuffer p = block(replica + 5, tp.rank() + 2, 0, kRows);
        const ActivationBuffer z = block(replica + 1, shard_rank, first, rows);
        ActivationBuffer p_consumed = p, reduced_p, gathered_z;
        region.reduce(p_consumed, kRows, kCols, reduced_p);
        region.gather(z, kRows, kCols, gathered_z);
        const double through_reduce = dot_of_region_tensor(grid, sequence_parallel, reduced_p, z);
        EXPECT_EQ(through_reduce, sum_over_tp_group(grid, dot(p, gathered_z)))
            << "the backward of reduce is not gather";
        EXPECT_NE(through_reduce, 0.0);
      });
}

}  // namespace
}  // namespace touchstone
