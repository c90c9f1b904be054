// What the communication layer reports about itself: byte counters, observer records, the trace
// printer, and the fault hook that makes a reduction wrong on purpose.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/comm/trace.h"
#include "tests/mpi/mpi_test.h"

namespace touchstone {
namespace {

using testing::MpiTest;

class CountersTest : public MpiTest {};

struct Expected {
  std::string op;
  int peer;
  Shape shape;
  int64_t bytes;
};

TEST_F(CountersTest, CountersAndObserverFollowTheByteConvention) {
  const int n = testing::world_size();
  std::unique_ptr<Grid> grid = Grid::create(GridLayout{1, n, 1});
  ProcessGroup& world = grid->world();
  std::vector<TransferRecord> records;
  grid->set_observer([&records](const TransferRecord& record) { records.push_back(record); });
  grid->context() = TraceContext{3, 1, "backward"};

  const int next = (world.rank() + 1) % n;
  const int previous = (world.rank() + n - 1) % n;
  std::vector<double> a(64 * n, 1.0), b(64 * n, 0.0);
  std::vector<int64_t> tokens(4, 1);
  world.all_reduce_sum(a.data(), 10, Shape{2, 5});
  world.all_reduce_sum(tokens.data(), 4);
  world.all_reduce_max(a.data(), 3, Shape{3});
  world.all_gather(a.data(), b.data(), 6, Shape{6});
  world.reduce_scatter_sum(a.data(), b.data(), 6, Shape{6});
  world.broadcast(a.data(), 5, 0, Shape{5});
  world.all_to_all(a.data(), b.data(), 2, Shape{2});
  world.send(a.data(), 7, next, 0, Shape{7});
  world.recv(b.data(), 7, previous, 0, Shape{7});
  world.wait_sends();
  world.barrier();

  // nccl-tests' size: the larger of this rank's send and receive buffers.
  const std::vector<Expected> expected = {
      {"all_reduce", -1, {2, 5}, 80},      {"all_reduce", -1, {4}, 32},
      {"all_reduce_max", -1, {3}, 24},     {"all_gather", -1, {6}, 48 * n},
      {"reduce_scatter", -1, {6}, 48 * n}, {"broadcast", -1, {5}, 40},
      {"all_to_all", -1, {2}, 16 * n},     {"send", next, {7}, 56},
      {"recv", previous, {7}, 56},         {"barrier", -1, {}, 0},
  };
  // Not ASSERT: this rank must still reach the barrier below with the others.
  EXPECT_EQ(records.size(), expected.size());
  int64_t total = 0;
  for (size_t i = 0; i < std::min(expected.size(), records.size()); ++i) {
    SCOPED_TRACE(expected[i].op);
    EXPECT_EQ(records[i].op, expected[i].op);
    EXPECT_EQ(records[i].group, "world");
    EXPECT_EQ(records[i].peer, expected[i].peer);
    EXPECT_EQ(records[i].shape, expected[i].shape);
    EXPECT_EQ(records[i].bytes, expected[i].bytes);
    EXPECT_EQ(records[i].context.step, 3);
    EXPECT_EQ(records[i].context.micro_batch, 1);
    EXPECT_EQ(records[i].context.phase, "backward");
    total += expected[i].bytes;
  }
  const TransferCounts& counts = world.counts();
  EXPECT_EQ(counts.total_calls(), 10);
  EXPECT_EQ(counts.total_bytes(), total);
  EXPECT_EQ(counts.by_op.at("all_reduce").calls, 2);
  EXPECT_EQ(counts.by_op.at("all_reduce").bytes, 112);
  EXPECT_EQ(counts.by_op.at("all_gather").bytes, 48 * n);
  EXPECT_EQ(counts.by_op.at("send").calls, 1);
  EXPECT_EQ(grid->tp().counts().total_calls(), 0);  // counters are per group
  world.reset_counts();
  EXPECT_EQ(world.counts().total_bytes(), 0);

  grid->set_observer(nullptr);
  world.barrier();
  EXPECT_EQ(records.size(), expected.size());
  EXPECT_EQ(world.counts().total_calls(), 1);  // counted without an observer too
}

TEST_F(CountersTest, FaultCorruptsTheNextReductionOnGroupRankZeroOnly) {
  const int n = testing::world_size();
  for (const GridLayout& layout : testing::layouts_of_world()) {
    SCOPED_TRACE(testing::describe(layout));
    std::unique_ptr<Grid> grid = Grid::create(layout);
    for (const char* name : {"world", "tp", "pp"}) {
      ProcessGroup& group = grid->group(name);
      const double m = group.size();
      const double extra = group.rank() == 0 ? 1.0 : 0.0;
      SCOPED_TRACE(name);

      group.set_fault(FaultKind::kCorruptReduction);
      std::vector<double> shard(2, -1.0), gathered(2 * group.size());
      group.all_gather(shard.data(), gathered.data(), 2, Shape{2});  // not a reduction: fault still set
      EXPECT_EQ(group.fault(), FaultKind::kCorruptReduction);
      std::vector<double> ones(3, 1.0);
      group.all_reduce_sum(ones.data(), 3, Shape{3});
      EXPECT_EQ(ones, (std::vector<double>{m + extra, m, m}));
      EXPECT_EQ(group.fault(), FaultKind::kNone);
      ones.assign(3, 1.0);
      group.all_reduce_sum(ones.data(), 3, Shape{3});  // the fault acts once
      EXPECT_EQ(ones, (std::vector<double>{m, m, m}));

      group.set_fault(FaultKind::kCorruptReduction);
      std::vector<int64_t> tokens(2, 5);
      group.all_reduce_sum(tokens.data(), 2);
      EXPECT_EQ(tokens, (std::vector<int64_t>{5 * group.size() + (group.rank() == 0), 5 * group.size()}));

      group.set_fault(FaultKind::kCorruptReduction);
      std::vector<double> send(2 * group.size(), 2.0), recv(2);
      group.reduce_scatter_sum(send.data(), recv.data(), 2, Shape{2});
      EXPECT_EQ(recv, (std::vector<double>{2 * m + extra, 2 * m}));

      group.set_fault(FaultKind::kCorruptReduction);
      std::vector<double> peak{static_cast<double>(group.rank())};
      group.all_reduce_max(peak.data(), 1, Shape{1});
      EXPECT_EQ(peak[0], m - 1 + extra);
    }
  }
  EXPECT_GT(n, 0);
}

TEST_F(CountersTest, TraceLineFormat) {
  TransferRecord record;
  record.op = "all_reduce";
  record.group = "tp";
  record.shape = {2, 16, 32};
  record.bytes = 8192;
  record.context = TraceContext{1, 2, "forward"};
  EXPECT_EQ(
      format_trace_line(3, GridCoordinates{1, 0, 1}, record),
      "[rank 3 tp1 cp0 dp0 pp1] step 1 mb 2 forward   all_reduce      group=tp  shape=[2,16,32]  bytes=8192");
  record.op = "send";
  record.group = "pp";
  record.peer = 5;
  record.context = TraceContext{};
  EXPECT_EQ(format_trace_line(3, GridCoordinates{1, 0, 1}, record),
            "[rank 3 tp1 cp0 dp0 pp1] step 0 mb - -         send            group=pp  shape=[2,16,32]  "
            "bytes=8192  peer=5");
  record.context = TraceContext{2, 3, "backward", 1};  // interleaved 1F1B: the model chunk too
  EXPECT_EQ(
      format_trace_line(3, GridCoordinates{1, 0, 1}, record),
      "[rank 3 tp1 cp0 dp0 pp1] step 2 mb 3 chunk 1 backward  send            group=pp  shape=[2,16,32]  "
      "bytes=8192  peer=5");
  // Context parallelism's coordinate, and the site a caller named.
  record.site = "decoder.layers.0.self_attention.core_attention ring step 1: K/V of cp rank 0";
  EXPECT_EQ(
      format_trace_line(3, GridCoordinates{1, 0, 1, 1}, record),
      "[rank 3 tp1 cp1 dp0 pp1] step 2 mb 3 chunk 1 backward  send            group=pp  shape=[2,16,32]  "
      "bytes=8192  peer=5  site=decoder.layers.0.self_attention.core_attention ring step 1: K/V of cp rank "
      "0");
}

TEST_F(CountersTest, ATransferSiteNamesTheTransfersOfItsScope) {
  std::unique_ptr<Grid> grid = Grid::create(GridLayout{1, testing::world_size(), 1});
  std::vector<TransferRecord> records;
  grid->set_observer([&](const TransferRecord& r) { records.push_back(r); });
  std::vector<double> data(4, 1.0);
  {
    const TransferSite site(grid->dp(), "finalize_model_grads: all-reduce of gradients over dp");
    grid->dp().all_reduce_sum(data.data(), 4, Shape{4});
  }
  grid->dp().all_reduce_sum(data.data(), 4, Shape{4});
  grid->set_observer(nullptr);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].site, "finalize_model_grads: all-reduce of gradients over dp");
  EXPECT_EQ(records[1].site, "") << "the site ends with its scope";
}

TEST_F(CountersTest, TracePrinterWritesOneLinePerTransferAndASummary) {
  const int n = testing::world_size();
  std::unique_ptr<Grid> grid = Grid::create(GridLayout{1, 1, n});
  std::ostringstream out;
  TracePrinter printer(out, *grid);
  grid->set_observer(printer.observer());
  grid->context() = TraceContext{1, 0, "grads"};
  std::vector<double> data(8, 1.0);
  grid->dp().all_reduce_sum(data.data(), 8, Shape{8});
  grid->embedding().all_reduce_sum(data.data(), 4, Shape{4});
  grid->world().barrier();
  grid->set_observer(nullptr);

  std::istringstream lines(out.str());
  std::string line;
  std::vector<std::string> all;
  while (std::getline(lines, line)) all.push_back(line);
  ASSERT_EQ(all.size(), 3u);
  const std::string prefix = "[rank " + std::to_string(testing::world_rank()) + " tp0 cp0 dp0 pp" +
                             std::to_string(testing::world_rank()) + "] step 1 mb 0 grads     ";
  EXPECT_EQ(all[0], prefix + "all_reduce      group=dp  shape=[8]  bytes=64");
  EXPECT_EQ(all[1], prefix + "all_reduce      group=embedding  shape=[4]  bytes=32");
  EXPECT_EQ(all[2], prefix + "barrier         group=world  shape=[]  bytes=0");

  EXPECT_EQ(printer.totals().at({"dp", "all_reduce"}).bytes, 64);
  std::ostringstream summary;
  printer.print_summary(summary);
  EXPECT_NE(summary.str().find("embedding all_reduce               1              32"), std::string::npos)
      << summary.str();
  EXPECT_NE(summary.str().find("total                              3              96"), std::string::npos)
      << summary.str();
}

}  // namespace
}  // namespace touchstone
