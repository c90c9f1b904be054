// The rounding points of BF16 attention (docs/precision.md): scores, softmax, the dropout multiply and
// the softmax backward in FP32; P' and dS fed to the following GEMMs in BF16 (as flash attention
// does); O, dQ, dK, dV stored in BF16 (dK and dV summed over a group's query heads in FP32 first).
// The reference below computes each of these in plain float loops and rounds with the test's own
// nearest-even (test_rounding_reference.h). Tolerance: none. Q, K, V and dO are small multiples of
// 1/8 and P', dS have BF16's 8 bits, so every GEMM of the kernel sums exactly in FP32 in any order
// (checked as a premise, per element); the float softmax is the same sequence of IEEE operations.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "test_rounding_reference.h"

namespace touchstone {
namespace {

using testing::bf16;

float f(double v) { return static_cast<float>(v); }
float bf16_float(float x) { return testing::bf16_nearest_even(x); }

// b = 2 windows, T = 8, 4 query heads on 2 KV heads, D = 4 (scale 1/2, a power of two: exact).
const AttentionShape kShape{2, 8, 4, 2, 4};

struct Inputs {
  std::vector<double> q, k, v, dout, keep;  // keep empty: no attention dropout
  std::vector<int32_t> documents;           // [b*T]: two documents in the first window
};

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
    auto backend = make_cpu_backend(BackendOptions{Precision::kBf16});
    const std::vector<int64_t> samples{4, 5};
    in.keep.resize(static_cast<size_t>(s.windows * s.num_heads * s.seq * s.seq));
    backend->attention_dropout_mask(DropoutSite{stream_key(9, "rounding/attention"), 0.25, samples.data()}, s,
                                    0, in.keep.data());
  }
  return in;
}

// Everything the BF16 kernel stores, computed by the reference, and how many BF16 outputs rounding
// changed (if none did, the comparison could not see a dropped rounding).
struct Reference {
  std::vector<double> probs, out, dq, dk, dv;
  int64_t rounded = 0;        // BF16 outputs that differ from their FP32 value
  int64_t not_truncated = 0;  // BF16 outputs where truncation would differ
};

Reference reference(const Inputs& in) {
  const AttentionShape& s = kShape;
  const int64_t T = s.seq, D = s.head_dim, group = s.num_heads / s.num_kv_heads;
  const float scale = f(s.scale());
  Reference r;
  r.probs.assign(static_cast<size_t>(s.windows * s.num_heads * T * T), 0.0);
  r.out.assign(in.q.size(), 0.0);
  r.dq.assign(in.q.size(), 0.0);
  std::vector<std::vector<double>> dk_terms(in.k.size()), dv_terms(in.v.size());  // summed over the group
  auto store_bf16 = [&](double exact, double& into) {
    EXPECT_EQ(static_cast<double>(f(exact)), exact) << "premise: the FP32 sum is exact";
    into = bf16(f(exact));
    r.rounded += into != exact;
    r.not_truncated += into != testing::bf16_truncated(f(exact));
  };
  auto exact_sum = [](const std::vector<double>& terms) {
    EXPECT_TRUE(testing::sums_exact_in_fp32(terms)) << "premise: FP32 sums these terms exactly in any order";
    double sum = 0.0;
    for (double t : terms) sum += t;
    return sum;
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
      const size_t head = static_cast<size_t>((b * s.num_heads + h) * T * T);
      // Scores and the masked softmax in FP32.
      std::vector<float> p(static_cast<size_t>(T * T), 0.0f), p_used(p.size()), ds(p.size());
      for (int64_t i = 0; i < T; ++i) {
        std::vector<float> scores(static_cast<size_t>(T));
        auto visible = [&](int64_t j) { return j <= i && doc[j] == doc[i]; };
        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < T; ++j) {
          std::vector<double> terms;
          for (int64_t d = 0; d < D; ++d)
            terms.push_back(static_cast<double>(scale) * q(i, d) * kv(in.k, j, d));
          scores[j] = f(exact_sum(terms));
          if (visible(j)) row_max = std::max(row_max, scores[j]);
        }
        float sum = 0.0f;
        std::vector<float> e(static_cast<size_t>(T), 0.0f);
        for (int64_t j = 0; j < T; ++j) {
          e[j] = visible(j) ? std::exp(scores[j] - row_max) : 0.0f;
          sum += e[j];
        }
        for (int64_t j = 0; j < T; ++j) {
          p[i * T + j] = e[j] / sum;
          r.probs[head + i * T + j] = p[i * T + j];
          // P' = P x keep in FP32, then fed to the P'V GEMM in BF16.
          const float dropped = in.keep.empty() ? p[i * T + j] : p[i * T + j] * f(in.keep[head + i * T + j]);
          p_used[i * T + j] = bf16_float(dropped);
        }
      }
      // O = P' V, rounded once.
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t d = 0; d < D; ++d) {
          std::vector<double> terms;
          for (int64_t j = 0; j < T; ++j)
            terms.push_back(static_cast<double>(p_used[i * T + j]) * kv(in.v, j, d));
          store_bf16(exact_sum(terms), r.out[static_cast<size_t>((b * T + i) * s.num_heads * D + h * D + d)]);
        }
      }
      // dV += P'^T dO;  dP' = dO V^T in FP32;  dP = dP' x keep;  dS = P (dP - rowsum(P dP)), fed in BF16.
      for (int64_t j = 0; j < T; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          for (int64_t i = 0; i < T; ++i)
            dv_terms[static_cast<size_t>(((b * s.num_kv_heads + g) * T + j) * D + d)].push_back(
                static_cast<double>(p_used[i * T + j]) * dout(i, d));
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          std::vector<double> terms;
          for (int64_t d = 0; d < D; ++d) terms.push_back(dout(i, d) * kv(in.v, j, d));
          ds[i * T + j] = f(exact_sum(terms));
          if (!in.keep.empty()) ds[i * T + j] *= f(in.keep[head + i * T + j]);
        }
        float dot = 0.0f;
        for (int64_t j = 0; j <= i; ++j) dot += p[i * T + j] * ds[i * T + j];
        for (int64_t j = 0; j < T; ++j) ds[i * T + j] = bf16_float(p[i * T + j] * (ds[i * T + j] - dot));
      }
      // dQ = dS K * scale, rounded once;  dK += dS^T Q * scale.
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t d = 0; d < D; ++d) {
          std::vector<double> terms;
          for (int64_t j = 0; j < T; ++j)
            terms.push_back(static_cast<double>(scale) * static_cast<double>(ds[i * T + j]) * kv(in.k, j, d));
          store_bf16(exact_sum(terms), r.dq[static_cast<size_t>(((b * s.num_heads + h) * T + i) * D + d)]);
        }
      }
      for (int64_t j = 0; j < T; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          for (int64_t i = 0; i < T; ++i)
            dk_terms[static_cast<size_t>(((b * s.num_kv_heads + g) * T + j) * D + d)].push_back(
                static_cast<double>(scale) * static_cast<double>(ds[i * T + j]) * q(i, d));
        }
      }
    }
  }
  // dK and dV: the group's heads accumulated in FP32 (exact under the premise), then stored in BF16.
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
  const double* keep = in.keep.empty() ? nullptr : in.keep.data();
  std::vector<double> out(in.q.size()), probs(want.probs.size());
  backend->attention_forward(in.q.data(), in.k.data(), in.v.data(), in.documents.data(), true, keep, s,
                             out.data(), probs.data());
  int64_t probs_misses = 0;  // FP32 probabilities, kept for backward
  for (size_t i = 0; i < probs.size(); ++i)
    probs_misses += probs[i] != want.probs[i] || !testing::is_fp32(probs[i]);
  EXPECT_EQ(probs_misses, 0) << "the FP32 probabilities";
  expect_bf16_equal(out, want.out, "O");
  std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  backend->attention_backward(in.dout.data(), in.q.data(), in.k.data(), in.v.data(), probs.data(), keep, s,
                              dq.data(), dk.data(), dv.data());
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
