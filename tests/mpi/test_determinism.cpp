// Reductions give the same bits on every rank and follow the documented order; point-to-point
// transfers can be received in any order without deadlock.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "tests/mpi/mpi_test.h"

namespace touchstone {
namespace {

using testing::for_every_group;
using testing::MpiTest;

// Non-integer values over 40 binary orders of magnitude: summing them in a different order almost
// always changes the last bits, so equal bits mean equal order.
std::vector<double> random_input(int global_rank, int64_t count) {
  std::mt19937_64 engine(static_cast<uint64_t>(1234 + global_rank));
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<double> values(static_cast<size_t>(count));
  for (double& v : values) v = std::ldexp(mantissa(engine), exponent(engine));
  return values;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

class DeterminismTest : public MpiTest {};

TEST_F(DeterminismTest, AllReduceSumAddsInRankOrder) {
  for_every_group([](ProcessGroup& group) {
    for (int64_t count : {int64_t{1}, int64_t{1001}}) {
      std::vector<double> data = random_input(group.global_rank(group.rank()), count);
      group.all_reduce_sum(data.data(), count, Shape{count});
      // ((x0 + x1) + x2) + ... element by element, as comm.h documents.
      std::vector<double> expected = random_input(group.global_rank(0), count);
      for (int k = 1; k < group.size(); ++k) {
        const std::vector<double> contribution = random_input(group.global_rank(k), count);
        for (size_t i = 0; i < expected.size(); ++i) expected[i] += contribution[i];
      }
      EXPECT_TRUE(same_bits(data, expected)) << "count " << count;
    }
  });
}

TEST_F(DeterminismTest, AllReduceSumGivesTheSameBitsOnEveryRank) {
  const int64_t count = 4099;
  std::unique_ptr<Grid> grid = Grid::create(GridLayout{1, testing::world_size(), 1});
  std::vector<double> first = random_input(testing::world_rank(), count);
  std::vector<double> second = first;
  grid->world().all_reduce_sum(first.data(), count, Shape{count});
  grid->world().all_reduce_sum(second.data(), count, Shape{count});
  EXPECT_TRUE(same_bits(first, second)) << "two runs of the same reduction differ";

  std::vector<double> all(static_cast<size_t>(count * testing::world_size()));
  MPI_Gather(first.data(), static_cast<int>(count), MPI_DOUBLE, all.data(), static_cast<int>(count),
             MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (testing::world_rank() == 0) {
    for (int r = 1; r < testing::world_size(); ++r) {
      const std::vector<double> theirs(all.begin() + r * count, all.begin() + (r + 1) * count);
      EXPECT_TRUE(same_bits(theirs, first)) << "rank " << r << " differs from rank 0";
    }
  }
}

TEST_F(DeterminismTest, AllReduceMaxIgnoresOrderForSignedZerosAndNaN) {
  for_every_group([](ProcessGroup& group) {
    const bool odd = group.rank() % 2 == 1;
    const double last = group.rank() == group.size() - 1 ? -std::numeric_limits<double>::quiet_NaN() : 1.0;
    std::vector<double> data = {odd ? 0.0 : -0.0, last, -3.0};
    group.all_reduce_max(data.data(), 3, Shape{3});
    // +0 beats -0 wherever an odd rank exists; any NaN wins, always as the same quiet NaN.
    EXPECT_EQ(std::signbit(data[0]), group.size() == 1);
    EXPECT_TRUE(std::isnan(data[1]));
    const double canonical = group.size() == 1 ? -std::numeric_limits<double>::quiet_NaN()
                                               : std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(std::memcmp(&data[1], &canonical, sizeof(double)), 0);
    EXPECT_EQ(data[2], -3.0);
  });
}

TEST_F(DeterminismTest, ReduceScatterThenAllGatherIsAllReduce) {
  for_every_group([](ProcessGroup& group) {
    const int n = group.size();
    const int64_t count = 250;
    const std::vector<double> input = random_input(group.global_rank(group.rank()), count * n);
    std::vector<double> reduced = input;
    group.all_reduce_sum(reduced.data(), count * n, Shape{count * n});
    std::vector<double> shard(static_cast<size_t>(count));
    group.reduce_scatter_sum(input.data(), shard.data(), count, Shape{count});
    std::vector<double> gathered(static_cast<size_t>(count * n));
    group.all_gather(shard.data(), gathered.data(), count, Shape{count});
    EXPECT_TRUE(same_bits(gathered, reduced));
    // And back: this rank's chunk of the gathered buffer is its own shard.
    const std::vector<double> own(gathered.begin() + group.rank() * count,
                                  gathered.begin() + (group.rank() + 1) * count);
    EXPECT_TRUE(same_bits(own, shard));
  });
}

TEST_F(DeterminismTest, MessagesAreReceivedInAnyTagOrder) {
  // Large enough for MPI's rendezvous protocol: a blocking send of micro-batch 1 would wait for
  // its receive while the receiver waits for micro-batch 0.
  const int64_t count = int64_t{1} << 18;
  for_every_group([count](ProcessGroup& group) {
    const int n = group.size();
    const int next = (group.rank() + 1) % n;
    const int previous = (group.rank() + n - 1) % n;
    auto message = [count](int sender, int micro_batch) {
      std::vector<double> m(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i)
        m[i] = static_cast<double>(sender * 1000 + micro_batch * 10 + i % 10);
      return m;
    };
    const int me = group.global_rank(group.rank());
    group.send(message(me, 1).data(), count, next, 1, Shape{count});
    group.send(message(me, 0).data(), count, next, 0, Shape{count});
    std::vector<double> received(static_cast<size_t>(count));
    for (int micro_batch : {0, 1}) {
      group.recv(received.data(), count, previous, micro_batch, Shape{count});
      EXPECT_TRUE(received == message(group.global_rank(previous), micro_batch))
          << "micro-batch " << micro_batch;
    }
    group.wait_sends();
  });
}

TEST_F(DeterminismTest, BothNeighboursSendBeforeEitherReceives) {
  // A pipeline stage sends activations forward and gradients backward before it receives.
  for_every_group([](ProcessGroup& group) {
    const int n = group.size();
    const int next = (group.rank() + 1) % n;
    const int previous = (group.rank() + n - 1) % n;
    const double me = group.rank();
    std::vector<double> forward(4096, me), backward(4096, -me), from_previous(4096), from_next(4096);
    group.send(forward.data(), 4096, next, 10, Shape{4096});
    group.send(backward.data(), 4096, previous, 11, Shape{4096});
    group.recv(from_next.data(), 4096, next, 11, Shape{4096});
    group.recv(from_previous.data(), 4096, previous, 10, Shape{4096});
    group.wait_sends();
    EXPECT_EQ(from_previous, std::vector<double>(4096, static_cast<double>(previous)));
    EXPECT_EQ(from_next, std::vector<double>(4096, -static_cast<double>(next)));
  });
}

TEST_F(DeterminismTest, ReceivingFewerElementsThanExpectedThrows) {
  for_every_group([](ProcessGroup& group) {
    const int n = group.size();
    std::vector<double> data(4, 1.0);
    group.send(data.data(), 3, (group.rank() + 1) % n, 5, Shape{3});
    EXPECT_THROW(group.recv(data.data(), 4, (group.rank() + n - 1) % n, 5, Shape{4}), std::runtime_error);
    group.wait_sends();
  });
}

}  // namespace
}  // namespace touchstone
