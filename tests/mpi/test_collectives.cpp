// Every collective against its exact expected result, on integer-valued doubles (exact in any
// summation order), on every group of every layout, out of place and in place.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tests/mpi/mpi_test.h"

namespace touchstone {
namespace {

using testing::counts_for;
using testing::for_every_group;
using testing::MpiTest;

// Member k of a group contributes value(global rank of k, i): a result that took data from the
// wrong rank, or from a rank outside the group, is wrong.
double value(int global_rank, int64_t i) { return static_cast<double>((global_rank + 1) * (i % 5 + 1)); }

double member_sum(ProcessGroup& group, int64_t i) {
  double sum = 0.0;
  for (int k = 0; k < group.size(); ++k) sum += value(group.global_rank(k), i);
  return sum;
}

std::vector<double> filled(int64_t count, double fill) {
  return std::vector<double>(static_cast<size_t>(count), fill);
}

class CollectiveTest : public MpiTest {};

TEST_F(CollectiveTest, AllReduceSumOfIntegerValuedDoubles) {
  for_every_group([](ProcessGroup& group) {
    const int me = group.global_rank(group.rank());
    for (int64_t count : counts_for(group.size())) {
      std::vector<double> data = filled(count, 0.0), expected = filled(count, 0.0);
      for (int64_t i = 0; i < count; ++i) {
        data[i] = value(me, i);
        expected[i] = member_sum(group, i);
      }
      group.all_reduce_sum(data.data(), count, Shape{count});
      EXPECT_EQ(data, expected) << "count " << count;
    }
  });
}

TEST_F(CollectiveTest, AllReduceSumOfIntegers) {
  for_every_group([](ProcessGroup& group) {
    const int64_t me = group.global_rank(group.rank());
    // Beyond 2^53, where a sum in doubles would round: integer sums must stay exact.
    const int64_t big = int64_t{1} << 58;
    std::vector<int64_t> data = {me, big + me, -7 * me};
    group.all_reduce_sum(data.data(), 3);
    int64_t members = 0;
    for (int k = 0; k < group.size(); ++k) members += group.global_rank(k);
    EXPECT_EQ(data, (std::vector<int64_t>{members, big * group.size() + members, -7 * members}));
  });
}

TEST_F(CollectiveTest, AllReduceMax) {
  for_every_group([](ProcessGroup& group) {
    auto input = [](int rank, int64_t i) { return static_cast<double>(((rank * 7 + i) % 11) - 5); };
    for (int64_t count : counts_for(group.size())) {
      std::vector<double> data = filled(count, 0.0), expected = filled(count, -1e300);
      for (int64_t i = 0; i < count; ++i) {
        data[i] = input(group.global_rank(group.rank()), i);
        for (int k = 0; k < group.size(); ++k)
          expected[i] = std::max(expected[i], input(group.global_rank(k), i));
      }
      group.all_reduce_max(data.data(), count, Shape{count});
      EXPECT_EQ(data, expected) << "count " << count;
    }
  });
}

TEST_F(CollectiveTest, AllGatherOutOfPlaceAndInPlace) {
  for_every_group([](ProcessGroup& group) {
    const int n = group.size();
    for (int64_t count : counts_for(n)) {
      std::vector<double> expected = filled(count * n, 0.0);
      for (int k = 0; k < n; ++k) {
        for (int64_t i = 0; i < count; ++i) expected[k * count + i] = value(group.global_rank(k), i);
      }
      for (bool in_place : {false, true}) {
        std::vector<double> send = filled(count, 0.0), recv = filled(count * n, -1.0);
        double* own = in_place ? recv.data() + group.rank() * count : send.data();
        for (int64_t i = 0; i < count; ++i) own[i] = value(group.global_rank(group.rank()), i);
        group.all_gather(own, recv.data(), count, Shape{count});
        EXPECT_EQ(recv, expected) << "count " << count << (in_place ? " in place" : " out of place");
      }
    }
  });
}

TEST_F(CollectiveTest, ReduceScatterOutOfPlaceAndInPlace) {
  for_every_group([](ProcessGroup& group) {
    const int n = group.size();
    for (int64_t count : counts_for(n)) {
      std::vector<double> expected = filled(count, 0.0);
      for (int64_t i = 0; i < count; ++i) expected[i] = member_sum(group, group.rank() * count + i);
      for (bool in_place : {false, true}) {
        std::vector<double> send = filled(count * n, 0.0), recv = filled(count, -1.0);
        for (int64_t j = 0; j < count * n; ++j) send[j] = value(group.global_rank(group.rank()), j);
        double* out = in_place ? send.data() + group.rank() * count : recv.data();
        group.reduce_scatter_sum(send.data(), out, count, Shape{count});
        EXPECT_EQ(std::vector<double>(out, out + count), expected)
            << "count " << count << (in_place ? " in place" : " out of place");
      }
    }
  });
}

TEST_F(CollectiveTest, BroadcastFromEveryRoot) {
  for_every_group([](ProcessGroup& group) {
    for (int root = 0; root < group.size(); ++root) {
      for (int64_t count : counts_for(group.size())) {
        std::vector<double> data = filled(count, -1.0), expected = filled(count, 0.0);
        for (int64_t i = 0; i < count; ++i) expected[i] = value(group.global_rank(root), i);
        if (group.rank() == root) data = expected;
        group.broadcast(data.data(), count, root, Shape{count});
        EXPECT_EQ(data, expected) << "count " << count << " root " << root;
      }
    }
  });
}

TEST_F(CollectiveTest, AllToAllOutOfPlaceAndInPlace) {
  for_every_group([](ProcessGroup& group) {
    const int n = group.size();
    // Chunk q of rank k carries k * 100 + q, so source and destination both show in the result.
    auto chunk_value = [](int source, int destination, int64_t i) {
      return value(source * 100 + destination, i);
    };
    for (int64_t count : counts_for(n)) {
      std::vector<double> expected = filled(count * n, 0.0);
      for (int k = 0; k < n; ++k) {
        for (int64_t i = 0; i < count; ++i) {
          expected[k * count + i] = chunk_value(group.global_rank(k), group.global_rank(group.rank()), i);
        }
      }
      for (bool in_place : {false, true}) {
        std::vector<double> send = filled(count * n, 0.0), recv = filled(count * n, -1.0);
        std::vector<double>& input = in_place ? recv : send;
        for (int q = 0; q < n; ++q) {
          for (int64_t i = 0; i < count; ++i) {
            input[q * count + i] = chunk_value(group.global_rank(group.rank()), group.global_rank(q), i);
          }
        }
        group.all_to_all(input.data(), recv.data(), count, Shape{count});
        EXPECT_EQ(recv, expected) << "count " << count << (in_place ? " in place" : " out of place");
      }
    }
  });
}

TEST_F(CollectiveTest, SendRecvAroundARing) {
  for_every_group([](ProcessGroup& group) {
    const int n = group.size();
    const int next = (group.rank() + 1) % n;
    const int previous = (group.rank() + n - 1) % n;
    for (int64_t count : counts_for(n)) {
      std::vector<double> data = filled(count, 0.0), expected = filled(count, 0.0);
      for (int64_t i = 0; i < count; ++i) {
        data[i] = value(group.global_rank(group.rank()), i);
        expected[i] = value(group.global_rank(previous), i);
      }
      group.send(data.data(), count, next, 7, Shape{count});
      std::fill(data.begin(), data.end(), -1.0);  // send copied the data: reusing the buffer is safe
      group.recv(data.data(), count, previous, 7, Shape{count});
      group.wait_sends();
      EXPECT_EQ(data, expected) << "count " << count;
    }
  });
}

}  // namespace
}  // namespace touchstone
