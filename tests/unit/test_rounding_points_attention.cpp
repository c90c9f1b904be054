// The rounding points of BF16 attention (docs/precision.md), in the tiled (flash-attention) form of
// kernels/cpu/attention.cpp: scores, the running max and sum, the exponentials, the dropout multiply,
// lse and the softmax backward in FP32; the unnormalised P~ x M (forward) and P', dS (backward) fed to
// the following GEMMs in BF16; O = acc / l, dQ, dK, dV stored in BF16 (dK and dV summed over a group's
// query heads in FP32 first). T = 8 is one tile, so each row's running max and sum are its plain max
// and sum. The reference below computes each of these in plain float loops and rounds with the test's
// own nearest-even (test_rounding_reference.h). Tolerance: none. Q, K, V and dO are small multiples of
// 1/8 and the GEMM operands have BF16's 8 bits, so every GEMM of the kernel sums exactly in FP32 in any
// order (checked as a premise, per element); the float softmax is the same sequence of IEEE operations.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dropout_mask.h"
#include "test_rounding_reference.h"

namespace touchstone {
namespace {

using testing::bf16;

float f(double v) { return static_cast<float>(v); }
float bf16_float(float x) { return testing::bf16_nearest_even(x); }

// b = 2 windows, T = 8, 4 query heads on 2 KV heads, D = 4 (scale 1/2, a power of two: exact).
const AttentionShape kShape{2, 8, 4, 2, 4};

struct Inputs {
  std::vector<double> q, k, v, dout, keep;  // keep [b,NH,T,T] empty: no attention dropout
  std::vector<int64_t> samples{4, 5};       // the windows' global sample indices
  std::vector<int32_t> documents;           // [b*T]: two documents in the first window
};

DropoutSite site(const Inputs& in) {
  return DropoutSite{stream_key(9, "rounding/attention"), 0.25, in.samples.data()};
}

Inputs make_inputs(bool dropout) {
  const AttentionShape& s = kShape;
  Inputs in;
  const auto n_q = static_cast<size_t>(s.windows * s.num_heads * s.seq * s.head_dim);
  const auto n_kv = static_cast<size_t>(s.windows * s.num_kv_heads * s.seq * s.head_dim);
  in.q = testing::small_multiples(n_q, 7, 3, 21);
  in.k = testing::small_multiples(n_kv, 7, 3, 22);
  in.v = testing::small_multiples(n_kv, 7, 3, 23);
  in.dout = testing::small_multiples(n_q, 7, 3, 24);
  in.documents = {0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  if (dropout) {
    in.keep.resize(static_cast<size_t>(s.windows * s.num_heads * s.seq * s.seq));
    fill_attention_dropout_mask(site(in), s, 0, Precision::kBf16, in.keep.data());
  }
  return in;
}

// Everything the BF16 kernel stores, computed by the reference, and how many BF16 outputs rounding
// changed (if none did, the comparison could not see a dropped rounding).
struct Reference {
  std::vector<double> lse, out, dq, dk, dv;
  int64_t rounded = 0;        // BF16 outputs that differ from their FP32 value
  int64_t not_truncated = 0;  // BF16 outputs where truncation would differ
};

Reference reference(const Inputs& in) {
  const AttentionShape& s = kShape;
  const int64_t T = s.seq, D = s.head_dim, group = s.num_heads / s.num_kv_heads;
  const float scale = f(s.scale());
  Reference r;
  r.lse.assign(static_cast<size_t>(s.windows * s.num_heads * T), 0.0);
  r.out.assign(in.q.size(), 0.0);
  r.dq.assign(in.q.size(), 0.0);
  std::vector<std::vector<double>> dq_terms(in.q.size());                         // over the keys
  std::vector<std::vector<double>> dk_terms(in.k.size()), dv_terms(in.v.size());  // and the group's heads
  auto store_bf16 = [&](float value, double& into) {
    into = bf16(value);
    r.rounded += into != static_cast<double>(value);
    r.not_truncated += into != testing::bf16_truncated(value);
  };
  auto exact_sum = [](const std::vector<double>& terms) {
    EXPECT_TRUE(testing::sums_exact_in_fp32(terms)) << "premise: FP32 sums these terms exactly in any order";
    double sum = 0.0;
    for (double t : terms) sum += t;
    EXPECT_EQ(static_cast<double>(f(sum)), sum) << "premise: the FP32 sum is exact";
    return f(sum);
  };
  for (int64_t b = 0; b < s.windows; ++b) {
    const int32_t* doc = in.documents.data() + b * T;
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t g = h / group;
      auto q = [&](int64_t i, int64_t d) {
        return in.q[static_cast<size_t>(((b * s.num_heads + h) * T + i) * D + d)];
      };
      auto kv = [&](const std::vector<double>& x, int64_t j, int64_t d) {
        return x[static_cast<size_t>(((b * s.num_kv_heads + g) * T + j) * D + d)];
      };
      auto dout = [&](int64_t i, int64_t d) {
        return in.dout[static_cast<size_t>((b * T + i) * s.num_heads * D + h * D + d)];
      };
      auto keep = [&](int64_t i, int64_t j) {
        return in.keep.empty() ? 1.0f
                               : f(in.keep[static_cast<size_t>(((b * s.num_heads + h) * T + i) * T + j)]);
      };
      auto visible = [&](int64_t i, int64_t j) { return j <= i && doc[j] == doc[i]; };
      // Scores in FP32 (the GEMM sums exactly); the row's max, exponentials and sum in FP32.
      std::vector<float> scores(static_cast<size_t>(T * T)), lse(static_cast<size_t>(T));
      std::vector<float> into_pv(scores.size());  // bf16(P~ x M)
      for (int64_t i = 0; i < T; ++i) {
        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < T; ++j) {
          std::vector<double> terms;
          for (int64_t d = 0; d < D; ++d)
            terms.push_back(static_cast<double>(scale) * q(i, d) * kv(in.k, j, d));
          scores[i * T + j] = exact_sum(terms);
          if (visible(i, j)) row_max = std::max(row_max, scores[i * T + j]);
        }
        // The row sum as the kernel adds it: four interleaved chains (keys j, j + 4, ...), then
        // (chain 0 + chain 1) + (chain 2 + chain 3).
        float chains[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t j = 0; j < T; ++j) {
          const float e = visible(i, j) ? std::exp(scores[i * T + j] - row_max) : 0.0f;
          chains[j % 4] += e;
          into_pv[i * T + j] = bf16_float(e * keep(i, j));  // P~ x M in FP32, into the GEMM in BF16
        }
        const float sum = (chains[0] + chains[1]) + (chains[2] + chains[3]);
        lse[i] = row_max + std::log(sum);
        r.lse[static_cast<size_t>((b * s.num_heads + h) * T + i)] = lse[i];
        // O = (P~ M V) / l: the FP32 sum (exact), divided in FP32, rounded once to BF16.
        for (int64_t d = 0; d < D; ++d) {
          std::vector<double> terms;
          for (int64_t j = 0; j < T; ++j)
            terms.push_back(static_cast<double>(into_pv[i * T + j]) * kv(in.v, j, d));
          store_bf16(exact_sum(terms) / sum,
                     r.out[static_cast<size_t>((b * T + i) * s.num_heads * D + h * D + d)]);
        }
      }
      // Backward: Delta_i = dO_i . O_i in FP32; P = exp(S - lse) recomputed in FP32; P' = P x M;
      // dV += P'^T dO;  dP' = dO V^T;  dP = dP' x M;  dS = P (dP - Delta), P' and dS fed in BF16.
      for (int64_t i = 0; i < T; ++i) {
        float delta = 0.0f;
        for (int64_t d = 0; d < D; ++d)
          delta += f(dout(i, d)) * f(r.out[static_cast<size_t>((b * T + i) * s.num_heads * D + h * D + d)]);
        for (int64_t j = 0; j < T; ++j) {
          const float p = visible(i, j) ? std::exp(scores[i * T + j] - lse[i]) : 0.0f;
          const float p_dropped = bf16_float(p * keep(i, j));
          for (int64_t d = 0; d < D; ++d)
            dv_terms[static_cast<size_t>(((b * s.num_kv_heads + g) * T + j) * D + d)].push_back(
                static_cast<double>(p_dropped) * dout(i, d));
          std::vector<double> terms;
          for (int64_t d = 0; d < D; ++d) terms.push_back(dout(i, d) * kv(in.v, j, d));
          const float dp = exact_sum(terms) * keep(i, j);
          const float ds = bf16_float(p * (dp - delta));
          for (int64_t d = 0; d < D; ++d) {
            dk_terms[static_cast<size_t>(((b * s.num_kv_heads + g) * T + j) * D + d)].push_back(
                static_cast<double>(scale) * static_cast<double>(ds) * q(i, d));
            dq_terms[static_cast<size_t>(((b * s.num_heads + h) * T + i) * D + d)].push_back(
                static_cast<double>(scale) * static_cast<double>(ds) * kv(in.k, j, d));
          }
        }
      }
    }
  }
  // dQ, dK and dV: accumulated in FP32 (exact under the premise), then stored in BF16.
  for (size_t i = 0; i < r.dq.size(); ++i) store_bf16(exact_sum(dq_terms[i]), r.dq[i]);
  r.dk.assign(in.k.size(), 0.0);
  r.dv.assign(in.v.size(), 0.0);
  for (size_t i = 0; i < in.k.size(); ++i) {
    store_bf16(exact_sum(dk_terms[i]), r.dk[i]);
    store_bf16(exact_sum(dv_terms[i]), r.dv[i]);
  }
  return r;
}

void expect_bf16_equal(const std::vector<double>& got, const std::vector<double>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if ((!testing::is_bf16(got[i]) || got[i] != want[i]) && misses++ < 3)
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", the reference's BF16 value is " << want[i];
  }
  EXPECT_EQ(misses, 0) << what;
}

void run_case(bool dropout) {
  const AttentionShape& s = kShape;
  const Inputs in = make_inputs(dropout);
  const Reference want = reference(in);
  EXPECT_GT(want.rounded, 0) << "no output needed rounding: a dropped rounding would not show";
  EXPECT_GT(want.not_truncated, 0) << "truncation would give the same outputs";
  auto backend = make_cpu_backend(BackendOptions{Precision::kBf16});
  const AttentionDropout attention_dropout = dropout ? AttentionDropout{site(in), 0} : AttentionDropout{};
  std::vector<double> out(in.q.size()), lse(want.lse.size());
  backend->attention_forward(in.q.data(), in.k.data(), in.v.data(), in.documents.data(), true,
                             attention_dropout, s, out.data(), lse.data());
  int64_t lse_misses = 0;  // FP32 log-sum-exp, kept for backward
  for (size_t i = 0; i < lse.size(); ++i) lse_misses += lse[i] != want.lse[i] || !testing::is_fp32(lse[i]);
  EXPECT_EQ(lse_misses, 0) << "the FP32 log-sum-exp";
  expect_bf16_equal(out, want.out, "O");
  std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  backend->attention_backward(in.dout.data(), in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(),
                              in.documents.data(), true, attention_dropout, s, dq.data(), dk.data(),
                              dv.data());
  expect_bf16_equal(dq, want.dq, "dQ");
  expect_bf16_equal(dk, want.dk, "dK");
  expect_bf16_equal(dv, want.dv, "dV");
}

TEST(RoundingPointsAttention, Fp32SoftmaxBf16ProbabilitiesIntoTheGemmsBf16Outputs) { run_case(false); }

TEST(RoundingPointsAttention, DropoutMultipliesTheFp32ProbabilitiesBeforeTheBf16Rounding) {
  const Inputs in = make_inputs(true);
  int64_t dropped = 0;
  for (double m : in.keep) dropped += m == 0.0;
  EXPECT_GT(dropped, 0);
  run_case(true);
}

}  // namespace
}  // namespace touchstone
