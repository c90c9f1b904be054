// Attention over blocks of a window (Backend::attention_block_forward / _backward / attention_merge), the
// kernels context parallelism is built from: a rank holds the query rows of some chunks of a window and
// sees the keys one chunk set at a time (ring attention), or all of them at once (all-gather).
//
// Each case cuts a window of T positions into 2 cp chunks and gives "rank" r the chunks r and
// 2cp - 1 - r (Megatron-LM's causal load balancing). Per rank, the query rows of its chunks are run
// against the key rows of every rank's chunks, one block at a time in ring order, and the blocks' outputs
// merged with the log-sum-exp rule; the backward of each block, given the merged output and lse, gives
// that block's dq (summed over the blocks) and its keys' dk, dv (summed over the query ranks). Every
// row must equal the whole-window call's row for the same position, in FP64 to 1e-12 relative L2 per
// tensor (the layout matrix's bound): the blocks only reorder sums. Each output element is a sum of at
// most K = T terms, so reordering moves it by at most c (K + tiles + merges) u relative to the sum of
// its terms' magnitudes (Higham; c = 2, u = 2^-53): 2 (200 + 4 + 4) 2^-53 = 4.6e-14 here. dQ and dK
// cancel by construction (dS sums to zero along a row), so their norms are smaller than their terms'
// magnitudes; 1e-12 leaves a factor 21 for that, and the measured errors are printed (about 1e-15).
//
// Besides: blocks that causality or document masking leave empty are skipped tile by tile (counted); a
// query row that sees no key of a block gets out = 0 and lse = -inf exactly, and merging it changes
// nothing; all-gather (one block of every key) equals the ring; and merging without the log-sum-exp
// weights is far from the whole window, so the comparison can fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention_rows.h"
#include "common/rng.h"
#include "kernels/backend.h"

namespace touchstone {
namespace {

using testing::relative_l2;

constexpr double kBound = 1e-12;

struct Case {
  std::string name;
  AttentionShape whole;            // seq = T of the window
  int64_t cp = 2;                  // 2 cp chunks
  std::vector<int64_t> documents;  // lengths, summing to T; each window packs them the same way
  bool masking = true;
  bool dropout = false;
};

std::vector<Case> cases() {
  const AttentionShape gqa{2, 200, 4, 2, 8};
  return {
      // Documents end at the chunk boundaries 50 and 150, one spans chunks 2 and 3.
      {"documents_gqa", gqa, 2, {30, 20, 1, 1, 70, 78}},
      {"documents_dropout", gqa, 2, {30, 20, 1, 1, 70, 78}, true, true},
      {"no_masking", gqa, 2, {200}, false},
      {"one_document_cp4", AttentionShape{1, 200, 2, 1, 16}, 4, {200}},
      {"single_token_documents", AttentionShape{1, 24, 2, 2, 4}, 2, std::vector<int64_t>(24, 1)},
  };
}

// The rows of `rank`: its chunks r and 2cp - 1 - r, ascending (Megatron-LM's load-balanced split).
std::vector<int32_t> rank_positions(int64_t T, int64_t cp, int64_t rank) {
  const int64_t c = T / (2 * cp);
  std::vector<int32_t> p;
  for (int64_t chunk : {rank, 2 * cp - 1 - rank}) {
    for (int64_t i = chunk * c; i < (chunk + 1) * c; ++i) p.push_back(static_cast<int32_t>(i));
  }
  return p;
}

struct Window {
  std::vector<double> q, k, v, dout;  // whole-window layouts: [b,NH,T,D], [b,NKV,T,D], [b*T,NH*D]
  std::vector<int32_t> documents;     // [b*T]
  std::vector<int64_t> samples;
  AttentionDropout dropout;
};

Window make_window(const Case& c) {
  const AttentionShape& s = c.whole;
  std::mt19937_64 generator(7);
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
    int32_t id = static_cast<int32_t>(100 * b);
    for (int64_t length : c.documents)
      w.documents.insert(w.documents.end(), static_cast<size_t>(length), id++);
    w.samples.push_back(11 + 3 * b);
  }
  if (c.dropout) {
    w.dropout.site = DropoutSite{stream_key(2026, "test/attention_blocks"), 0.2, w.samples.data()};
    w.dropout.first_head = 1;
  }
  return w;
}

// One rank's view: its query rows, and per key source its key rows, with positions and documents.
struct Rows {
  std::vector<int32_t> positions, documents;  // [b*rows]
};

Rows rows_of(const Window& w, int64_t windows, int64_t T, const std::vector<int32_t>& positions) {
  Rows r;
  for (int64_t b = 0; b < windows; ++b) {
    for (int32_t p : positions) {
      r.positions.push_back(p);
      r.documents.push_back(w.documents[static_cast<size_t>(b * T + p)]);
    }
  }
  return r;
}

struct Whole {
  std::vector<double> out, lse, dq, dk, dv;
};

Whole run_whole(Backend& backend, const Case& c, const Window& w) {
  const AttentionShape& s = c.whole;
  Whole r;
  r.out.assign(w.q.size(), 0.0);
  r.lse.assign(static_cast<size_t>(s.windows * s.num_heads * s.seq), 0.0);
  r.dq.assign(w.q.size(), 0.0);
  r.dk.assign(w.k.size(), 0.0);
  r.dv.assign(w.v.size(), 0.0);
  backend.attention_forward(w.q.data(), w.k.data(), w.v.data(), w.documents.data(), c.masking, w.dropout, s,
                            r.out.data(), r.lse.data());
  backend.attention_backward(w.dout.data(), w.q.data(), w.k.data(), w.v.data(), r.out.data(), r.lse.data(),
                             w.documents.data(), c.masking, w.dropout, s, r.dq.data(), r.dk.data(),
                             r.dv.data());
  return r;
}

// The keys of one ring step: rank `theirs`' rows of K and V, and the block pairing them with `queries`.
struct KeyBlock {
  std::vector<int32_t> positions;
  Rows keys;
  AttentionBlock block;
  std::vector<double> k, v;
  KeyBlock(const Window& w, int64_t b, int64_t T, int64_t NKV, int64_t D, const Rows& queries,
           std::vector<int32_t> theirs)
      : positions(std::move(theirs)),
        keys(rows_of(w, b, T, positions)),
        block{static_cast<int64_t>(positions.size()),
              T,
              queries.positions.data(),
              queries.documents.data(),
              keys.positions.data(),
              keys.documents.data()},
        k(testing::take_rows(w.k, b * NKV, T, D, positions)),
        v(testing::take_rows(w.v, b * NKV, T, D, positions)) {}
};

// How a rank combines its blocks' forwards.
enum class Merge { kLogSumExp, kPlainSum };

// Ring attention of every rank, forward then backward, laid back into whole-window tensors.
Whole run_ring(Backend& backend, const Case& c, const Window& w, Merge merge = Merge::kLogSumExp) {
  const AttentionShape& s = c.whole;
  const int64_t T = s.seq, b = s.windows, D = s.head_dim, NH = s.num_heads, NKV = s.num_kv_heads;
  Whole r;
  r.out.assign(w.q.size(), 0.0);
  r.lse.assign(static_cast<size_t>(b * NH * T), 0.0);
  r.dq.assign(w.q.size(), 0.0);
  r.dk.assign(w.k.size(), 0.0);
  r.dv.assign(w.v.size(), 0.0);
  for (int64_t rank = 0; rank < c.cp; ++rank) {
    const std::vector<int32_t> mine = rank_positions(T, c.cp, rank);
    const int64_t Tq = static_cast<int64_t>(mine.size());
    const AttentionShape local{b, Tq, NH, NKV, D};
    const Rows queries = rows_of(w, b, T, mine);
    const std::vector<double> q = testing::take_rows(w.q, b * NH, T, D, mine),
                              dout = testing::take_rows(w.dout, b, T, NH * D, mine);
    std::vector<double> out(q.size(), 0.0), lse(static_cast<size_t>(b * NH * Tq), -INFINITY);
    std::vector<double> block_out(q.size()), block_lse(lse.size());
    // Ring order: the rank's own keys first, then those of rank - 1, rank - 2, ... (each step receives
    // the previous rank's block).
    for (int64_t step = 0; step < c.cp; ++step) {
      const KeyBlock kb(w, b, T, NKV, D, queries, rank_positions(T, c.cp, (rank - step + c.cp) % c.cp));
      backend.attention_block_forward(q.data(), kb.k.data(), kb.v.data(), kb.block, c.masking, w.dropout,
                                      local, block_out.data(), block_lse.data());
      if (merge == Merge::kLogSumExp) {
        backend.attention_merge(block_out.data(), block_lse.data(), local, out.data(), lse.data());
      } else {  // the mistake: outputs added as they are, each normalised over its own block only
        for (size_t i = 0; i < out.size(); ++i) out[i] += block_out[i];
        for (size_t i = 0; i < lse.size(); ++i) lse[i] = std::max(lse[i], block_lse[i]);
      }
    }
    testing::add_rows(out, b, T, NH * D, mine, r.out);
    testing::add_rows(lse, b * NH, T, 1, mine, r.lse);
    // Backward: each block's share, with the merged out and lse.
    std::vector<double> dq_sum(q.size(), 0.0), dq(q.size());
    for (int64_t step = 0; step < c.cp; ++step) {
      const KeyBlock kb(w, b, T, NKV, D, queries, rank_positions(T, c.cp, (rank - step + c.cp) % c.cp));
      const std::vector<int32_t>& theirs = kb.positions;
      const std::vector<double>&k = kb.k, &v = kb.v;
      std::vector<double> dk(k.size()), dv(v.size());
      backend.attention_block_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                       kb.block, c.masking, w.dropout, local, dq.data(), dk.data(),
                                       dv.data());
      for (size_t i = 0; i < dq.size(); ++i) dq_sum[i] += dq[i];
      testing::add_rows(dk, b * NKV, T, D, theirs, r.dk);
      testing::add_rows(dv, b * NKV, T, D, theirs, r.dv);
    }
    testing::add_rows(dq_sum, b * NH, T, D, mine, r.dq);
  }
  return r;
}

TEST(AttentionBlocks, RingOfLoadBalancedChunksEqualsTheWholeWindow) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto backend = make_cpu_backend();
    const Window w = make_window(c);
    const Whole whole = run_whole(*backend, c, w);
    const Whole ring = run_ring(*backend, c, w);
    for (auto [name, got, want] :
         {std::tuple{"out", &ring.out, &whole.out}, std::tuple{"lse", &ring.lse, &whole.lse},
          std::tuple{"dq", &ring.dq, &whole.dq}, std::tuple{"dk", &ring.dk, &whole.dk},
          std::tuple{"dv", &ring.dv, &whole.dv}}) {
      const double error = relative_l2(*got, *want);
      std::cout << c.name << " " << name << ": relative L2 " << error << "\n";
      EXPECT_LE(error, kBound) << name;
    }
  }
}

TEST(AttentionBlocks, MergingWithoutTheLogSumExpWeightsIsFarFromTheWholeWindow) {
  // The comparison above can fail: adding the blocks' outputs as they are (each normalised over its own
  // keys) is off by about the output's own size wherever a query sees keys in two blocks.
  const Case c = cases()[0];
  auto backend = make_cpu_backend();
  const Window w = make_window(c);
  const Whole whole = run_whole(*backend, c, w);
  const Whole wrong = run_ring(*backend, c, w, Merge::kPlainSum);
  EXPECT_GT(relative_l2(wrong.out, whole.out), 0.1);
}

TEST(AttentionBlocks, AllGatherIsOneBlockOfEveryKey) {
  // Llama 3's scheme: the rank's queries against the whole window's keys at once.
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto backend = make_cpu_backend();
    const Window w = make_window(c);
    const Whole whole = run_whole(*backend, c, w);
    const AttentionShape& s = c.whole;
    std::vector<int32_t> all(static_cast<size_t>(s.seq));
    std::iota(all.begin(), all.end(), 0);
    const Rows keys = rows_of(w, s.windows, s.seq, all);
    for (int64_t rank = 0; rank < c.cp; ++rank) {
      const std::vector<int32_t> mine = rank_positions(s.seq, c.cp, rank);
      const Rows queries = rows_of(w, s.windows, s.seq, mine);
      const AttentionShape local{s.windows, static_cast<int64_t>(mine.size()), s.num_heads, s.num_kv_heads,
                                 s.head_dim};
      const AttentionBlock block{s.seq,
                                 s.seq,
                                 queries.positions.data(),
                                 queries.documents.data(),
                                 keys.positions.data(),
                                 keys.documents.data()};
      const std::vector<double> q = testing::take_rows(w.q, s.windows * s.num_heads, s.seq, s.head_dim, mine);
      std::vector<double> out(q.size()), lse(static_cast<size_t>(s.windows * s.num_heads) * mine.size());
      backend->attention_block_forward(q.data(), w.k.data(), w.v.data(), block, c.masking, w.dropout, local,
                                       out.data(), lse.data());
      EXPECT_LE(
          relative_l2(out, testing::take_rows(whole.out, s.windows, s.seq, s.num_heads * s.head_dim, mine)),
          kBound);
      EXPECT_LE(relative_l2(lse, testing::take_rows(whole.lse, s.windows * s.num_heads, s.seq, 1, mine)),
                kBound);
    }
  }
}

TEST(AttentionBlocks, AQueryThatSeesNoKeyOfTheBlockGetsZeroAndMinusInfinity) {
  // Chunk 0's queries against chunk 3's keys: every key lies after every query, so the whole block is
  // skipped, and the rows are exactly 0 and -inf; merging them into a result changes no bit of it.
  const Case c = cases()[0];
  const AttentionShape& s = c.whole;
  auto backend = make_cpu_backend();
  const Window w = make_window(c);
  const std::vector<int32_t> first = rank_positions(s.seq, 2, 0);  // chunks 0 and 3
  const std::vector<int32_t> early(first.begin(), first.begin() + 50), late(first.begin() + 50, first.end());
  const Rows queries = rows_of(w, s.windows, s.seq, early), keys = rows_of(w, s.windows, s.seq, late);
  const AttentionShape local{s.windows, 50, s.num_heads, s.num_kv_heads, s.head_dim};
  const AttentionBlock block{50,
                             s.seq,
                             queries.positions.data(),
                             queries.documents.data(),
                             keys.positions.data(),
                             keys.documents.data()};
  const std::vector<double> q = testing::take_rows(w.q, s.windows * s.num_heads, s.seq, s.head_dim, early);
  const std::vector<double> k = testing::take_rows(w.k, s.windows * s.num_kv_heads, s.seq, s.head_dim, late);
  const std::vector<double> v = testing::take_rows(w.v, s.windows * s.num_kv_heads, s.seq, s.head_dim, late);
  std::vector<double> out(q.size(), 7.0), lse(static_cast<size_t>(s.windows * s.num_heads * 50), 7.0);
  const AttentionTileCount before = backend->attention_tiles();
  backend->attention_block_forward(q.data(), k.data(), v.data(), block, true, {}, local, out.data(),
                                   lse.data());
  const AttentionTileCount after = backend->attention_tiles();
  EXPECT_EQ(after.computed, before.computed) << "a block after every query is never computed";
  EXPECT_EQ(after.skipped - before.skipped, s.windows * s.num_heads) << "one tile pair per window and head";
  for (double e : out) ASSERT_EQ(e, 0.0);
  for (double e : lse) ASSERT_EQ(e, -std::numeric_limits<double>::infinity());
  // Merged into a result, it leaves every bit as it was.
  std::vector<double> running(q.size()), running_lse(lse.size());
  for (size_t i = 0; i < running.size(); ++i) running[i] = 0.25 + static_cast<double>(i % 7);
  for (size_t i = 0; i < running_lse.size(); ++i) running_lse[i] = 1.5 - static_cast<double>(i % 3);
  const std::vector<double> kept = running, kept_lse = running_lse;
  backend->attention_merge(out.data(), lse.data(), local, running.data(), running_lse.data());
  EXPECT_EQ(running, kept);
  EXPECT_EQ(running_lse, kept_lse);
}

TEST(AttentionBlocks, DocumentMaskingSkipsBlocksNoDocumentSpans) {
  // Single-token documents: chunk 1's queries against chunk 0's keys are causally allowed, but no
  // query shares a document with any key, so the block is skipped; against their own keys, computed.
  const Case c = cases()[4];
  const AttentionShape& s = c.whole;
  auto backend = make_cpu_backend();
  const Window w = make_window(c);
  std::vector<int32_t> chunk0(6), chunk1(6);
  std::iota(chunk0.begin(), chunk0.end(), 0);
  std::iota(chunk1.begin(), chunk1.end(), 6);
  const Rows queries = rows_of(w, s.windows, s.seq, chunk1);
  const AttentionShape local{s.windows, 6, s.num_heads, s.num_kv_heads, s.head_dim};
  const std::vector<double> q = testing::take_rows(w.q, s.windows * s.num_heads, s.seq, s.head_dim, chunk1);
  std::vector<double> out(q.size()), lse(static_cast<size_t>(s.windows * s.num_heads * 6));
  for (const auto& [keys_at, computed] : {std::pair{chunk0, false}, std::pair{chunk1, true}}) {
    const Rows keys = rows_of(w, s.windows, s.seq, keys_at);
    const AttentionBlock block{6,
                               s.seq,
                               queries.positions.data(),
                               queries.documents.data(),
                               keys.positions.data(),
                               keys.documents.data()};
    const std::vector<double> k =
        testing::take_rows(w.k, s.windows * s.num_kv_heads, s.seq, s.head_dim, keys_at);
    const std::vector<double> v =
        testing::take_rows(w.v, s.windows * s.num_kv_heads, s.seq, s.head_dim, keys_at);
    const AttentionTileCount before = backend->attention_tiles();
    backend->attention_block_forward(q.data(), k.data(), v.data(), block, true, {}, local, out.data(),
                                     lse.data());
    const AttentionTileCount after = backend->attention_tiles();
    EXPECT_EQ(after.computed - before.computed, computed ? s.windows * s.num_heads : 0);
    EXPECT_EQ(after.skipped - before.skipped, computed ? 0 : s.windows * s.num_heads);
  }
}

}  // namespace
}  // namespace touchstone
