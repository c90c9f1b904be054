// ContextParallelAttention (parallel/context/context_attention.h) on its own, its cp group spread over
// the whole world (2 and 4 ranks), with both ways the keys travel (p2p ring, all-gather).
//
// Every rank draws the same whole windows (q, k, v, dO) and computes the whole-window attention with the
// CPU backend as the reference; it then keeps the rows of its two chunks (LoadBalancedSplit) and runs
// the context-parallel forward and backward on them. Its out, lse, dq, dk and dv must equal the
// reference's rows, in FP64 to 1e-12 relative L2 per tensor: the blocks, merges and the reduce-scatter
// only reorder sums of at most T = 256 terms (2 (256 + 4 + 4) 2^-53 = 5.9e-14 relative to the terms'
// magnitudes, with room for dQ's and dK's cancellation; tests/unit/test_attention_blocks.cpp derives it).
// Cases: documents that end at chunk boundaries and one spanning chunks, a window whose second half is
// padding (the last rank's chunks hold no token of a real document), one document over the whole window,
// single-token documents, no document masking, dropout (keyed by positions, so the same mask), GQA.
// Also: the bytes each way moves against the analytic count, and the same bits on a second run.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/rng.h"
#include "kernels/backend.h"
#include "parallel/comm/grid.h"
#include "parallel/context/context_attention.h"
#include "tests/mpi/mpi_test.h"
#include "tests/unit/attention_rows.h"

namespace touchstone {
namespace {

using testing::MpiTest;
using testing::relative_l2;
using testing::take_rows;

class ContextAttentionTest : public MpiTest {};

constexpr double kBound = 1e-12;

struct Case {
  std::string name;
  std::vector<int64_t> documents;  // lengths summing to T = 256; -1: padding to the end
  bool masking = true;
  bool dropout = false;
};

const AttentionShape kWhole{2, 256, 4, 2, 8};

std::vector<Case> cases() {
  return {
      {"documents", {32, 32, 1, 95, 60, 36}},  // boundaries at 32 and 64 (chunk ends at cp = 4 and 2)
      {"second_half_padding", {40, 88, -1}},
      {"one_document", {256}},
      {"single_token_documents", std::vector<int64_t>(256, 1)},
      {"no_masking", {100, 156}, false},
      {"dropout", {32, 32, 1, 95, 60, 36}, true, true},
  };
}

struct Tensors {
  std::vector<double> out, lse, dq, dk, dv;
};

struct Window {
  std::vector<double> q, k, v, dout;
  std::vector<int32_t> documents;
  std::vector<int64_t> samples{5, 9};
  AttentionDropout dropout;
};

Window make_window(const Case& c) {
  const AttentionShape& s = kWhole;
  std::mt19937_64 generator(2026);  // the same on every rank
  auto draw = [&](int64_t n, double sd) {
    std::normal_distribution<double> normal(0.0, sd);
    std::vector<double> x(static_cast<size_t>(n));
    for (double& e : x) e = normal(generator);
    return x;
  };
  Window w;
  w.q = draw(s.windows * s.num_heads * s.seq * s.head_dim, 0.5);
  w.k = draw(s.windows * s.num_kv_heads * s.seq * s.head_dim, 0.5);
  w.v = draw(s.windows * s.num_kv_heads * s.seq * s.head_dim, 1.0);
  w.dout = draw(s.windows * s.seq * s.num_heads * s.head_dim, 1.0);
  for (int64_t b = 0; b < s.windows; ++b) {
    int32_t id = static_cast<int32_t>(10 * b);
    for (int64_t length : c.documents) {
      const int64_t n = length < 0 ? s.seq * (b + 1) - static_cast<int64_t>(w.documents.size()) : length;
      w.documents.insert(w.documents.end(), static_cast<size_t>(n), length < 0 ? -1 : id++);
    }
  }
  if (c.dropout) {
    w.dropout.site = DropoutSite{stream_key(2026, "test/context_attention"), 0.2, w.samples.data()};
    w.dropout.first_head = 2;
  }
  return w;
}

Tensors whole_window(const Case& c, const Window& w) {
  auto backend = make_cpu_backend();
  const AttentionShape& s = kWhole;
  Tensors t{std::vector<double>(w.q.size()),
            std::vector<double>(static_cast<size_t>(s.windows * s.num_heads * s.seq)),
            std::vector<double>(w.q.size()), std::vector<double>(w.k.size()),
            std::vector<double>(w.v.size())};
  backend->attention_forward(w.q.data(), w.k.data(), w.v.data(), w.documents.data(), c.masking, w.dropout, s,
                             t.out.data(), t.lse.data());
  backend->attention_backward(w.dout.data(), w.q.data(), w.k.data(), w.v.data(), t.out.data(), t.lse.data(),
                              w.documents.data(), c.masking, w.dropout, s, t.dq.data(), t.dk.data(),
                              t.dv.data());
  return t;
}

// This rank's rows of the whole-window tensors.
Tensors rows_of(const Tensors& t, const std::vector<int32_t>& mine) {
  const AttentionShape& s = kWhole;
  return Tensors{take_rows(t.out, s.windows, s.seq, s.num_heads * s.head_dim, mine),
                 take_rows(t.lse, s.windows * s.num_heads, s.seq, 1, mine),
                 take_rows(t.dq, s.windows * s.num_heads, s.seq, s.head_dim, mine),
                 take_rows(t.dk, s.windows * s.num_kv_heads, s.seq, s.head_dim, mine),
                 take_rows(t.dv, s.windows * s.num_kv_heads, s.seq, s.head_dim, mine)};
}

Tensors context_parallel(ProcessGroup& cp, CpComm comm, const Case& c, const Window& w) {
  auto backend = make_cpu_backend();
  const AttentionShape& s = kWhole;
  const LoadBalancedSplit split(s.seq, cp.size());
  const std::vector<int32_t> mine = split.positions(cp.rank());
  const AttentionShape local{s.windows, split.local_seq(), s.num_heads, s.num_kv_heads, s.head_dim};
  const std::vector<double> q = take_rows(w.q, s.windows * s.num_heads, s.seq, s.head_dim, mine);
  const std::vector<double> k = take_rows(w.k, s.windows * s.num_kv_heads, s.seq, s.head_dim, mine);
  const std::vector<double> v = take_rows(w.v, s.windows * s.num_kv_heads, s.seq, s.head_dim, mine);
  const std::vector<double> dout = take_rows(w.dout, s.windows, s.seq, s.num_heads * s.head_dim, mine);
  Tensors t{std::vector<double>(q.size()),
            std::vector<double>(static_cast<size_t>(s.windows * s.num_heads) * mine.size()),
            std::vector<double>(q.size()), std::vector<double>(k.size()), std::vector<double>(v.size())};
  const ContextParallelAttention attention(cp, comm, *backend);
  attention.forward(q.data(), k.data(), v.data(), w.documents.data(), c.masking, w.dropout, local,
                    t.out.data(), t.lse.data());
  attention.backward(dout.data(), q.data(), k.data(), v.data(), t.out.data(), t.lse.data(),
                     w.documents.data(), c.masking, w.dropout, local, t.dq.data(), t.dk.data(), t.dv.data());
  return t;
}

const char* comm_name(CpComm comm) { return comm == CpComm::kP2p ? "p2p" : "allgather"; }

TEST_F(ContextAttentionTest, EveryRankComputesItsRowsOfTheWholeWindow) {
  std::unique_ptr<Grid> grid = Grid::create(GridLayout{testing::world_size(), 1, 1});
  ProcessGroup& cp = grid->tp();  // the world as one group of cp ranks
  for (const Case& c : cases()) {
    const Window w = make_window(c);
    const Tensors want =
        rows_of(whole_window(c, w), LoadBalancedSplit(kWhole.seq, cp.size()).positions(cp.rank()));
    for (CpComm comm : {CpComm::kP2p, CpComm::kAllGather}) {
      SCOPED_TRACE(c.name + " " + comm_name(comm));
      const Tensors got = context_parallel(cp, comm, c, w);
      EXPECT_LE(relative_l2(got.out, want.out), kBound) << "out";
      EXPECT_LE(relative_l2(got.lse, want.lse), kBound) << "lse";
      EXPECT_LE(relative_l2(got.dq, want.dq), kBound) << "dq";
      EXPECT_LE(relative_l2(got.dk, want.dk), kBound) << "dk";
      EXPECT_LE(relative_l2(got.dv, want.dv), kBound) << "dv";
      // Deterministic: a second run gives the same bits.
      const Tensors again = context_parallel(cp, comm, c, w);
      EXPECT_EQ(again.out, got.out);
      EXPECT_EQ(again.dk, got.dk);
    }
  }
}

TEST_F(ContextAttentionTest, BytesMovedAreTheAnalyticCount) {
  // K and V of one rank: 2 b NKV (T/cp) D doubles. p2p: cp - 1 ring steps of that block in the forward;
  // in the backward cp - 1 again and cp steps of its dK/dV accumulator (one more, home), each send
  // matched by a receive of the same size. allgather: one all-gather of it in the forward, one in the
  // backward, one reduce-scatter of the gathered size (nccl-tests' size: cp times the block).
  std::unique_ptr<Grid> grid = Grid::create(GridLayout{testing::world_size(), 1, 1});
  ProcessGroup& cp = grid->tp();
  const int64_t n = cp.size();
  const int64_t block_bytes =
      2 * kWhole.windows * kWhole.num_kv_heads * (kWhole.seq / n) * kWhole.head_dim * 8;
  const Case c = cases()[0];
  const Window w = make_window(c);
  for (CpComm comm : {CpComm::kP2p, CpComm::kAllGather}) {
    SCOPED_TRACE(comm_name(comm));
    cp.reset_counts();
    context_parallel(cp, comm, c, w);
    const TransferCounts& counts = cp.counts();
    if (comm == CpComm::kP2p) {
      EXPECT_EQ(counts.by_op.at("send").calls, 3 * (n - 1) + 1);
      EXPECT_EQ(counts.by_op.at("send").bytes, (3 * (n - 1) + 1) * block_bytes);
      EXPECT_EQ(counts.by_op.at("recv").bytes, (3 * (n - 1) + 1) * block_bytes);
      EXPECT_EQ(counts.by_op.count("all_gather"), 0u);
    } else {
      EXPECT_EQ(counts.by_op.at("all_gather").calls, 2);
      EXPECT_EQ(counts.by_op.at("all_gather").bytes, 2 * n * block_bytes);
      EXPECT_EQ(counts.by_op.at("reduce_scatter").bytes, n * block_bytes);
      EXPECT_EQ(counts.by_op.count("send"), 0u);
    }
  }
}

}  // namespace
}  // namespace touchstone
