// The tiled (flash) CPU attention (kernels/cpu/attention.cpp) computes the dense attention it replaced
// (dense_attention.h, the O(T^2) formulation): in FP64 to 1e-13 on edge shapes (T = 1, 63, 64, 65, 130,
// single-token documents, padding, GQA and MHA, masking and dropout on and off, a query tile whose first
// key tile holds no visible key); the tiles it skips are exactly the tile pairs with no visible entry
// on packed documents, and never a pair with one; its bits do not depend on the thread count; its FP32
// and BF16 modes stay within bounds derived from their rounding points.
//
// The error measure. Every output element is a sum (of products P V, dS K, ... or, for lse, of
// exponentials) and the roundings of a sum are bounded relative to the sum of its terms' magnitudes,
// not to its value, which cancellation can make arbitrarily small (dS sums to 0 along each row, so dQ
// cancels by construction). So each element e gets its magnitude A_e, its sum with every term taken
// in absolute value (computed below from the dense reference), and a tensor is compared by
//   ||tiled - dense||_2 / ||A||_2
// which the per-element bounds below bound directly (||err|| <= bound * ||A|| from |err_e| <= bound
// * A_e). The plain relative L2 error ||tiled - dense|| / ||dense|| is printed beside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/rng.h"
#include "dense_attention.h"
#include "kernel_threads_guard.h"
#include "kernels/attention_tiles.h"
#include "kernels/backend.h"
#include "kernels/cpu/parallel_for.h"
#include "kernels/precision.h"

namespace touchstone {
namespace {

constexpr double kU64 = 0x1p-53;  // FP64 unit roundoff
constexpr double kU32 = 0x1p-24;  // FP32 unit roundoff

// FP64, tiled against dense: the bound, fixed before measuring.
//
// The two forms compute the same sums in different orders: the dense one each row's softmax sum and
// P'V over all T keys at once, the tiled one per key tile, rescaling its running sum and accumulator
// by exp(m_old - m_new) once per tile; the backward's sums over keys (dQ) and queries (dK, dV) are
// split into tiles the same way, and the tiled Delta_i = dO_i . O_i replaces the dense
// sum_j P_ij dP_ij (equal in exact arithmetic). Each result is within gamma_K ~ K u of its exact value
// relative to the sum of its terms' magnitudes (Higham), K the longest reduction (visible keys of a
// row, visible queries of a key, or D), plus one rounding per tile for the rescale, so per element
//   |tiled - dense| <= c * (K + tiles) * u * A_e,   u = 2^-53, c = 2 (one such error on each side).
// The scores' own rounding (a D-term sum, ~ D u sum_d |q_d k_d| scale) reaches P through exp() as a
// relative error; q and k have standard deviation 0.5, so sum_d |q_d k_d| scale stays near 2 and this
// adds D * sigma (sigma the largest such sum, computed and printed; at most 2.2 here) to K + tiles.
// The exponentials differ too: the tiled FP64 kernel's (cpu::exp_fp64) are within 2 ulp of exp, the
// dense one's (libm) within 1, an ulp being at most 2u of the value: 6u between the two, which adds
// 3 to K + tiles (c = 2 doubles it).
// For the edge shapes (T <= 130: K <= 130, tiles <= 3, D <= 16) this is
//   2 * (130 + 3 + 16 * 2.2 + 3) * 2^-53 ~ 3.8e-14,  2.6x below 1e-13,
// and for the unmasked T = 256 of the skip test (K = 256, 4 tiles) 2 * (256 + 4 + 35 + 3) u ~ 6.6e-14,
// 1.5x below, in the worst case where every rounding error has the same sign; errors of independent
// signs grow like sqrt(K) u instead (~ 2e-15), 50x below. The test checks this worst case per case as
// a premise (derived <= 1e-13) and the measured error against 1e-13.
constexpr double kFp64Bound = 1e-13;

// FP32 and BF16 against the dense FP64 reference on the same (format-rounded) inputs: precision.md's
// form for a pass, 8 * (eps_storage + sqrt(K) * eps_fp32), with eps_storage the storage format's unit
// roundoff. The rounding points: in FP32 mode every stored value (O, dQ, dK, dV, lse) carries one FP32
// rounding (2^-24) and the FP32 sums of length K (the scores, the softmax sums, the GEMMs over keys and
// queries) random-walk errors of sqrt(K) 2^-24 relative to their magnitudes. In BF16 mode the GEMM
// operands P~*M (forward), P' and dS (backward) are rounded to BF16 (2^-9 relative each) and O, dQ,
// dK, dV are stored in BF16 (2^-9 again): 2^-8 relative to the magnitudes, with the FP32 sums beside
// it. The factor 8 covers the chain of such steps an output goes through (scores -> P -> O -> Delta ->
// dS -> dQ), four to six of them, each adding its own error of that size. K = T = 130 here.
double fp32_bound(int64_t seq) { return 8 * (kU32 + std::sqrt(static_cast<double>(seq)) * kU32); }
double bf16_bound(int64_t seq) { return 8 * (0x1p-8 + std::sqrt(static_cast<double>(seq)) * kU32); }

const char* precision_name(Precision p) {
  return p == Precision::kFp64 ? "fp64" : p == Precision::kFp32 ? "fp32" : "bf16";
}

using testing::KernelThreadsGuard;

// Document ids of one window from the lengths of its documents, as the packer writes them
// (data/packing.h): consecutive ids, then kPaddingDocument (-1) for `padding` trailing positions.
std::vector<int32_t> packed(const std::vector<int64_t>& lengths, int32_t first_id, int64_t padding = 0) {
  std::vector<int32_t> ids;
  for (size_t d = 0; d < lengths.size(); ++d)
    ids.insert(ids.end(), static_cast<size_t>(lengths[d]), first_id + static_cast<int32_t>(d));
  ids.insert(ids.end(), static_cast<size_t>(padding), -1);
  return ids;
}

struct Case {
  std::string name;
  AttentionShape shape;
  std::vector<int32_t> documents;  // [b*T]
  bool masking = true;
  bool dropout = true;
};

// Two windows with the same layout of documents (other ids in the second; padding stays -1).
std::vector<int32_t> two_windows(const std::vector<int64_t>& lengths, int64_t padding = 0) {
  std::vector<int32_t> ids = packed(lengths, 0, padding);
  const std::vector<int32_t> second = packed(lengths, 10, padding);
  ids.insert(ids.end(), second.begin(), second.end());
  return ids;
}

struct Inputs {
  std::vector<double> q, k, v, dout;
  std::vector<int64_t> samples;  // [b] global sample index of each window
  AttentionDropout dropout;
};

// Normal values, q and k with standard deviation 0.5 (scores near 1, see kFp64Bound), v and dO 1,
// rounded to the format the precision's kernels receive (FP32 or BF16 activations), so that the FP64
// reference sees exactly the kernel's inputs.
Inputs make_inputs(const Case& c, Precision precision, uint64_t seed) {
  const AttentionShape& s = c.shape;
  const int64_t n_q = s.windows * s.num_heads * s.seq * s.head_dim;
  const int64_t n_kv = s.windows * s.num_kv_heads * s.seq * s.head_dim;
  std::mt19937_64 generator(seed);
  auto draw = [&](int64_t n, double sd) {
    std::normal_distribution<double> normal(0.0, sd);
    std::vector<double> x(static_cast<size_t>(n));
    for (double& e : x) {
      e = normal(generator);
      if (precision == Precision::kFp32) e = round_to_fp32(e);
      if (precision == Precision::kBf16) e = round_to_bf16(e);
    }
    return x;
  };
  Inputs in;
  in.q = draw(n_q, 0.5);
  in.k = draw(n_kv, 0.5);
  in.v = draw(n_kv, 1.0);
  in.dout = draw(n_q, 1.0);
  for (int64_t b = 0; b < s.windows; ++b) in.samples.push_back(37 + 5 * b);
  if (c.dropout) {
    // p = 0.2, windows at global samples 37, 42, ... and the rank's first global head 3 (tensor
    // parallelism), so that a kernel ignoring either would draw another mask.
    in.dropout.site = DropoutSite{stream_key(2026, "test/attention_tiled"), 0.2, in.samples.data()};
    in.dropout.first_head = 3;
  }
  return in;
}

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
  AttentionTileCount tiles;  // counted across the forward call
};

Result run_tiled(Precision precision, const Case& c, const Inputs& in) {
  const AttentionShape& s = c.shape;
  auto backend = make_cpu_backend(BackendOptions{precision});
  Result r;
  r.out.assign(in.q.size(), 0.0);
  r.lse.assign(static_cast<size_t>(s.windows * s.num_heads * s.seq), 0.0);
  r.dq.assign(in.q.size(), 0.0);
  r.dk.assign(in.k.size(), 0.0);
  r.dv.assign(in.v.size(), 0.0);
  const AttentionTileCount before = backend->attention_tiles();
  backend->attention_forward(in.q.data(), in.k.data(), in.v.data(), c.documents.data(), c.masking, in.dropout,
                             s, r.out.data(), r.lse.data());
  const AttentionTileCount after = backend->attention_tiles();
  r.tiles = {after.computed - before.computed, after.skipped - before.skipped};
  backend->attention_backward(in.dout.data(), in.q.data(), in.k.data(), in.v.data(), r.out.data(),
                              r.lse.data(), c.documents.data(), c.masking, in.dropout, s, r.dq.data(),
                              r.dk.data(), r.dv.data());
  return r;
}

struct Dense {
  dense::Forward forward;
  dense::Backward backward;
};

Dense run_dense(const Case& c, const Inputs& in) {
  Dense d;
  d.forward = dense::attention_forward(in.q, in.k, in.v, c.documents, c.masking, in.dropout, c.shape);
  d.backward = dense::attention_backward(in.dout, in.q, in.k, in.v, d.forward, c.shape);
  return d;
}

// Each element's sum of term magnitudes A_e, and what the FP64 bound depends on.
struct Magnitudes {
  std::vector<double> out, lse, dq, dk, dv;
  int64_t longest = 0;  // K: the longest reduction (visible keys of a row, visible queries of a key, D)
  double sigma = 0.0;   // the largest sum_d |q_d k_d| * scale over the visible pairs
};

Magnitudes magnitudes(const Case& c, const Inputs& in, const dense::Forward& f) {
  const AttentionShape& s = c.shape;
  const int64_t T = s.seq, D = s.head_dim, group = s.num_heads / s.num_kv_heads, width = s.num_heads * D;
  const double scale = s.scale();
  Magnitudes a;
  a.out.assign(in.q.size(), 0.0);
  a.lse.assign(static_cast<size_t>(s.windows * s.num_heads * T), 0.0);
  a.dq.assign(in.q.size(), 0.0);
  a.dk.assign(in.k.size(), 0.0);
  a.dv.assign(in.v.size(), 0.0);
  a.longest = D;
  std::vector<double> dp(static_cast<size_t>(T * T));    // |dO| |V|^T * M
  std::vector<double> grad(static_cast<size_t>(T * T));  // G = P (|dP| + sum_j P |dP|): dS's magnitude
  for (int64_t b = 0; b < s.windows; ++b) {
    const int32_t* docs = c.documents.data() + b * T;
    for (int64_t i = 0; i < T; ++i) {
      int64_t keys = 0, queries = 0;
      for (int64_t j = 0; j < T; ++j) {
        keys += dense::visible(docs, c.masking, i, j);
        queries += dense::visible(docs, c.masking, j, i);
      }
      a.longest = std::max({a.longest, keys, queries});
    }
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t g = h / group;
      const double* qh = in.q.data() + (b * s.num_heads + h) * T * D;
      const double* kg = in.k.data() + (b * s.num_kv_heads + g) * T * D;
      const double* vg = in.v.data() + (b * s.num_kv_heads + g) * T * D;
      const double* doh = in.dout.data() + b * T * width + h * D;
      const double* p = f.probs.data() + (b * s.num_heads + h) * T * T;
      const double* m = f.keep.data() + (b * s.num_heads + h) * T * T;
      for (int64_t i = 0; i < T; ++i) {
        double largest = 0.0, delta = 0.0;
        for (int64_t j = 0; j < T; ++j) {
          double qk = 0.0, dov = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            qk += std::abs(qh[i * D + d] * kg[j * D + d]);
            dov += std::abs(doh[i * width + d] * vg[j * D + d]);
          }
          if (dense::visible(docs, c.masking, i, j)) largest = std::max(largest, qk * scale);
          dp[static_cast<size_t>(i * T + j)] = dov * m[i * T + j];
          delta += p[i * T + j] * dp[static_cast<size_t>(i * T + j)];
          for (int64_t d = 0; d < D; ++d) {
            a.out[static_cast<size_t>((b * T + i) * width + h * D + d)] +=
                p[i * T + j] * m[i * T + j] * std::abs(vg[j * D + d]);
            a.dv[static_cast<size_t>((b * s.num_kv_heads + g) * T * D + j * D + d)] +=
                p[i * T + j] * m[i * T + j] * std::abs(doh[i * width + d]);
          }
        }
        a.sigma = std::max(a.sigma, largest);
        // lse = m + log l: the max is one score (error ~ D u sigma), log l (l in [1, T]) an error of
        // the sum's relative one; both measured against 1 + the largest score magnitude.
        a.lse[static_cast<size_t>((b * s.num_heads + h) * T + i)] = 1.0 + largest;
        for (int64_t j = 0; j < T; ++j)
          grad[static_cast<size_t>(i * T + j)] = p[i * T + j] * (dp[static_cast<size_t>(i * T + j)] + delta);
      }
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          const double gij = grad[static_cast<size_t>(i * T + j)] * scale;
          for (int64_t d = 0; d < D; ++d) {
            a.dq[static_cast<size_t>((b * s.num_heads + h) * T * D + i * D + d)] +=
                gij * std::abs(kg[j * D + d]);
            a.dk[static_cast<size_t>((b * s.num_kv_heads + g) * T * D + j * D + d)] +=
                gij * std::abs(qh[i * D + d]);
          }
        }
      }
    }
  }
  return a;
}

struct Error {
  double scaled = 0.0;    // ||got - want|| / ||A||: what the bounds bound
  double relative = 0.0;  // ||got - want|| / ||want||: printed
};

double norm(const std::vector<double>& x) {
  double sum = 0.0;
  for (double e : x) sum += e * e;
  return std::sqrt(sum);
}

Error error(const std::vector<double>& got, const std::vector<double>& want,
            const std::vector<double>& magnitude) {
  double sum = 0.0;
  for (size_t e = 0; e < got.size(); ++e) sum += (got[e] - want[e]) * (got[e] - want[e]);
  const double diff = std::sqrt(sum);  // NaN if any element is: then every comparison below fails
  return Error{diff / norm(magnitude), diff / norm(want)};
}

// Compares every output of the tiled kernel in `precision` with the dense reference within `bound` and
// prints the errors; returns the worst scaled error.
double expect_matches_dense(const Case& c, Precision precision, double bound, uint64_t seed) {
  const Inputs in = make_inputs(c, precision, seed);
  const Result tiled = run_tiled(precision, c, in);
  const Dense ref = run_dense(c, in);
  const Magnitudes a = magnitudes(c, in, ref.forward);
  struct Named {
    const char* name;
    const std::vector<double>& got;
    const std::vector<double>& want;
    const std::vector<double>& magnitude;
  };
  const Named tensors[] = {{"out", tiled.out, ref.forward.out, a.out},
                           {"lse", tiled.lse, ref.forward.lse, a.lse},
                           {"dq", tiled.dq, ref.backward.dq, a.dq},
                           {"dk", tiled.dk, ref.backward.dk, a.dk},
                           {"dv", tiled.dv, ref.backward.dv, a.dv}};
  double worst = 0.0;
  std::cout << c.name << " (" << precision_name(precision) << ", T " << c.shape.seq << ", K " << a.longest
            << ", sigma " << a.sigma << ", bound " << bound << "):";
  for (const Named& t : tensors) {
    const Error e = error(t.got, t.want, t.magnitude);
    EXPECT_LE(e.scaled, bound) << c.name << " " << t.name << " (relative L2 " << e.relative << ")";
    EXPECT_TRUE(std::all_of(t.got.begin(), t.got.end(), [](double x) { return std::isfinite(x); }))
        << c.name << " " << t.name << " is not finite everywhere";
    worst = std::max(worst, e.scaled);
    // dense 0: dS = P (dP - P dP) vanishes exactly for a row that sees one key, where the tiled
    // Delta = dO . O leaves a rounding error (covered by the scaled error).
    std::cout << " " << t.name << " " << e.scaled << " (rel ";
    if (norm(t.want) == 0.0) {
      std::cout << "- dense 0)";
    } else {
      std::cout << e.relative << ")";
    }
  }
  std::cout << "; worst " << worst << "\n";
  if (precision == Precision::kFp64) {
    // The premise of kFp64Bound for this case's shapes: the worst-case bound below 1e-13.
    const int64_t tiles = (c.shape.seq + kAttentionTile - 1) / kAttentionTile;
    const double exp_ulps = 3;  // exp_fp64's 2 ulp against libm's 1, in units of 2u (kFp64Bound)
    const double derived = 2 *
                           (static_cast<double>(a.longest + tiles) +
                            static_cast<double>(c.shape.head_dim) * a.sigma + exp_ulps) *
                           kU64;
    EXPECT_LE(derived, kFp64Bound) << c.name << ": the worst-case bound's premise";
    std::cout << "  worst-case bound 2 (K + tiles + D sigma + 3) u = " << derived << "\n";
  }
  return worst;
}

AttentionShape shape(int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim = 16) {
  return AttentionShape{2, seq, heads, kv_heads, head_dim};
}

TEST(AttentionTiled, Fp64MatchesDenseOnEdgeShapes) {
  std::vector<Case> cases = {
      {"T1_gqa_masked_dropout", shape(1, 4, 2, 8), two_windows({1}), true, true},
      {"T1_mha_unmasked", shape(1, 2, 2, 8), two_windows({1}), false, false},
      {"T63_gqa_masked_dropout", shape(63, 4, 2), two_windows({20, 43}), true, true},
      {"T64_gqa_unmasked_dropout", shape(64, 4, 2), two_windows({64}), false, true},
      {"T64_mha_masked", shape(64, 2, 2), two_windows({40, 24}), true, false},
      {"T65_mha_masked_last_alone", shape(65, 2, 2), two_windows({64, 1}), true, false},
      {"T65_gqa_masked_dropout", shape(65, 4, 2), two_windows({10, 55}), true, true},
      {"T130_gqa_masked_dropout", shape(130, 4, 2), two_windows({30, 50, 50}), true, true},
      {"T130_mha_unmasked", shape(130, 2, 2), two_windows({130}), false, false},
      // Masked windows whose tile pairs below the diagonal see every key: one document over the window,
      // and a document starting on a tile edge (pair (2, 1) all visible, (1, 0) skipped).
      {"T130_gqa_masked_one_document_dropout", shape(130, 4, 2), two_windows({130}), true, true},
      {"T130_mha_masked_document_on_tile_edge", shape(130, 2, 2), two_windows({64, 66}), true, false},
      {"T130_gqa_unmasked_dropout", shape(130, 4, 2), two_windows({130}), false, true},
      {"single_token_documents_dropout", shape(130, 4, 2), two_windows(std::vector<int64_t>(130, 1)), true,
       true},
      {"single_token_documents", shape(130, 2, 2), two_windows(std::vector<int64_t>(130, 1)), true, false},
      // The packer's padding: a trailing run of kPaddingDocument, whose rows see only padding when
      // masked (one more "document") and everything before them when not.
      {"padding_tail_masked_dropout", shape(130, 4, 2), two_windows({50, 50}, 30), true, true},
      {"padding_tail_unmasked_dropout", shape(130, 4, 2), two_windows({50, 50}, 30), false, true},
      {"padding_tail_past_tile_masked", shape(130, 4, 2), two_windows({60}, 70), true, false},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    ASSERT_EQ(c.documents.size(), static_cast<size_t>(c.shape.windows * c.shape.seq)) << c.name;
    expect_matches_dense(c, Precision::kFp64, kFp64Bound, seed++);
  }
}

// T = 1: the single query sees only itself, so P = 1 and O = M_00 v_0 exactly on both sides (one
// product, rounded once; the tiled rescale exp(-inf) = 0 and the division by l = 1 are exact).
TEST(AttentionTiled, SingleQuery) {
  for (const bool dropout : {false, true}) {
    const Case c{dropout ? "T1_dropout" : "T1", shape(1, 4, 2, 8), two_windows({1}), true, dropout};
    const Inputs in = make_inputs(c, Precision::kFp64, 7);
    const Result tiled = run_tiled(Precision::kFp64, c, in);
    const Dense ref = run_dense(c, in);
    EXPECT_EQ(tiled.out, ref.forward.out) << c.name;
    expect_matches_dense(c, Precision::kFp64, kFp64Bound, 7);
  }
}

// Documents [0, 70) and [70, 130): queries 70..127 lie in query tile 1, whose ids {0, 1} overlap key
// tile 0's {0}, so the range rule computes the pair although those queries see none of its keys. Their
// running max stays -inf through tile 0 and the rescale exp(-inf - m) must not turn into NaN.
TEST(AttentionTiled, FirstKeyTileWithoutVisibleKey) {
  for (const bool dropout : {false, true}) {
    const Case c{dropout ? "first_tile_invisible_dropout" : "first_tile_invisible", shape(130, 4, 2),
                 two_windows({70, 60}), true, dropout};
    const WholeWindowBlock whole(c.documents.data(), c.shape.windows, c.shape.seq);
    const WindowMask mask(whole.block, c.shape.seq, 0, true, false);
    ASSERT_TRUE(mask.tile_needed(1, 0)) << "premise: the pair is computed";
    for (int64_t i = 70; i < 128; ++i) {
      for (int64_t j = 0; j < kAttentionTile; ++j)
        ASSERT_FALSE(mask.visible(i, j)) << "premise " << i << " " << j;
    }
    expect_matches_dense(c, Precision::kFp64, kFp64Bound, 9);
  }
}

// The tile pairs of one window with no visible entry, by brute force over every (i, j).
int64_t empty_pairs(const int32_t* docs, bool masking, int64_t seq) {
  const int64_t tiles = (seq + kAttentionTile - 1) / kAttentionTile;
  int64_t empty = 0;
  for (int64_t qt = 0; qt < tiles; ++qt) {
    for (int64_t kt = 0; kt < tiles; ++kt) {
      bool any = false;
      for (int64_t i = qt * kAttentionTile; i < std::min(seq, (qt + 1) * kAttentionTile); ++i) {
        for (int64_t j = kt * kAttentionTile; j < std::min(seq, (kt + 1) * kAttentionTile); ++j)
          any = any || dense::visible(docs, masking, i, j);
      }
      empty += !any;
    }
  }
  return empty;
}

TEST(AttentionTiled, SkipsExactlyTheEmptyTilePairs) {
  const int64_t T = 256;
  std::vector<int32_t> alternating(static_cast<size_t>(2 * T));
  for (size_t i = 0; i < alternating.size(); ++i) alternating[i] = static_cast<int32_t>(i % 2);
  std::vector<int32_t> monotone = packed({10, 70, 100, 76}, 0);
  const std::vector<int32_t> second = packed({100, 56, 3, 97}, 4);
  monotone.insert(monotone.end(), second.begin(), second.end());
  struct SkipCase {
    Case c;
    bool exact;  // ids grow along the window: the range rule skips exactly the empty pairs
  };
  const std::vector<SkipCase> cases = {
      {{"packed_monotone", shape(T, 4, 2), monotone, true, true}, true},
      {{"unmasked", shape(T, 4, 2), monotone, false, true}, true},
      // Ids 0, 1, 0, 1, ...: every tile's range is [0, 1], so only causality skips; the range rule may
      // skip fewer pairs than are empty, never more.
      {{"alternating_ids", shape(T, 4, 2), alternating, true, true}, false},
      // Padding's -1 after larger ids is not monotone either.
      {{"padding_tail", shape(T, 4, 2), two_windows({10, 70, 100}, 76), true, true}, false},
  };
  uint64_t seed = 200;
  for (const SkipCase& sc : cases) {
    const Case& c = sc.c;
    ASSERT_EQ(c.documents.size(), static_cast<size_t>(c.shape.windows * T)) << c.name;
    const Inputs in = make_inputs(c, Precision::kFp64, seed++);
    const Result tiled = run_tiled(Precision::kFp64, c, in);
    const int64_t tiles = (T + kAttentionTile - 1) / kAttentionTile;
    int64_t empty = 0;  // counted once per query head, as attention_tiles does
    for (int64_t b = 0; b < c.shape.windows; ++b)
      empty += c.shape.num_heads * empty_pairs(c.documents.data() + b * T, c.masking, T);
    EXPECT_EQ(tiled.tiles.computed + tiled.tiles.skipped, c.shape.windows * c.shape.num_heads * tiles * tiles)
        << c.name;
    if (sc.exact) {
      EXPECT_EQ(tiled.tiles.skipped, empty) << c.name;
    } else {
      EXPECT_LE(tiled.tiles.skipped, empty) << c.name;
    }
    std::cout << c.name << ": skipped " << tiled.tiles.skipped << " of "
              << tiled.tiles.computed + tiled.tiles.skipped << ", empty by brute force " << empty << "\n";
    expect_matches_dense(c, Precision::kFp64, kFp64Bound, seed++);
  }
}

TEST(AttentionTiled, SameBitsOnAnyThreadCount) {
  const KernelThreadsGuard guard;
  const Case c{"threads", shape(130, 4, 2), two_windows({30, 50, 50}), true, true};
  for (const Precision precision : {Precision::kFp64, Precision::kFp32, Precision::kBf16}) {
    const Inputs in = make_inputs(c, precision, 300);
    cpu::set_kernel_threads(1);
    const Result serial = run_tiled(precision, c, in);
    for (const int threads : {2, 3}) {
      cpu::set_kernel_threads(threads);
      const Result parallel = run_tiled(precision, c, in);
      const std::pair<const std::vector<double>*, const std::vector<double>*> outputs[] = {
          {&serial.out, &parallel.out},
          {&serial.lse, &parallel.lse},
          {&serial.dq, &parallel.dq},
          {&serial.dk, &parallel.dk},
          {&serial.dv, &parallel.dv}};
      for (size_t o = 0; o < std::size(outputs); ++o) {
        const auto& [one, many] = outputs[o];
        ASSERT_EQ(one->size(), many->size());
        EXPECT_EQ(std::memcmp(one->data(), many->data(), one->size() * sizeof(double)), 0)
            << precision_name(precision) << " output " << o << " on " << threads << " threads";
      }
    }
  }
}

TEST(AttentionTiled, Fp32AndBf16WithinTheirBounds) {
  const std::vector<Case> cases = {
      {"T130_gqa_masked_dropout", shape(130, 4, 2), two_windows({30, 50, 50}), true, true},
      {"T130_mha_unmasked", shape(130, 2, 2), two_windows({130}), false, false},
      // The masked windows of Fp64MatchesDenseOnEdgeShapes whose tile pairs see every key.
      {"T130_gqa_masked_one_document_dropout", shape(130, 4, 2), two_windows({130}), true, true},
      {"T130_mha_masked_document_on_tile_edge", shape(130, 2, 2), two_windows({64, 66}), true, false},
  };
  for (const Case& c : cases) {
    const double fp32 = expect_matches_dense(c, Precision::kFp32, fp32_bound(c.shape.seq), 400);
    const double bf16 = expect_matches_dense(c, Precision::kBf16, bf16_bound(c.shape.seq), 401);
    // The comparison sees the formats: far above FP64 noise, BF16 far above FP32.
    EXPECT_GT(fp32, 1e-9) << c.name;
    EXPECT_GT(bf16, 1e-4) << c.name;
  }
}

}  // namespace
}  // namespace touchstone
