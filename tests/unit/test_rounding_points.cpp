// The BF16 rounding points of docs/precision.md, one operator at a time through the Backend interface:
// every output is exactly representable in the format the table names, and equals a reference this
// test computes itself (the FP32 arithmetic in plain float loops, then round to nearest even by the
// definition in test_rounding_reference.h). Exact equality is the tolerance: both sides perform the
// same IEEE float operations, and the GEMM inputs are chosen so that FP32 accumulation is exact in
// any order (sums_exact_in_fp32), whatever OpenBLAS's blocking or thread count. Each BF16 check also
// requires that rounding changed some element and that nearest-even differed from truncation in some,
// so that dropping a rounding call or truncating instead fails it. Attention is in
// test_rounding_points_attention.cpp, the whole training step in test_rounding_points_step.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "test_rounding_reference.h"

namespace touchstone {
namespace {

using testing::bf16;
using testing::bf16_truncated;

enum class Format { kFp32, kBf16 };

// Expected stored values, with the evidence that the comparison can see a wrong rounding.
struct Expected {
  std::vector<double> values;
  int64_t rounded = 0;        // BF16 differs from the FP32 result: a dropped rounding shows
  int64_t not_truncated = 0;  // nearest-even differs from truncation: truncating shows
  bool rounds = true;         // false for a copy, which has no rounding of its own to see

  void bf16_of(float fp32) {
    values.push_back(bf16(fp32));
    rounded += values.back() != static_cast<double>(fp32);
    not_truncated += values.back() != bf16_truncated(fp32);
  }
  void fp32(float value) { values.push_back(static_cast<double>(value)); }
};

// Every element of `got` is exactly a `format` value and equals the expected one bitwise.
void expect_stored(const std::vector<double>& got, const Expected& want, Format format,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.values.size()) << what;
  int64_t wrong_format = 0, wrong_value = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool in_format = format == Format::kBf16 ? testing::is_bf16(got[i]) : testing::is_fp32(got[i]);
    if (!in_format && wrong_format++ < 3)
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << " is not stored in the format";
    if (got[i] != want.values[i] && wrong_value++ < 3) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", the reference gives " << want.values[i];
    }
  }
  EXPECT_EQ(wrong_format, 0) << what;
  EXPECT_EQ(wrong_value, 0) << what;
  if (format == Format::kBf16 && want.rounds) {
    EXPECT_GT(want.rounded, 0) << what << ": no element needed rounding, the check cannot see a missing one";
    EXPECT_GT(want.not_truncated, 0) << what << ": truncation would give the same values";
  }
}

std::unique_ptr<Backend> bf16_backend(bool fusion = true) {
  return make_cpu_backend(BackendOptions{Precision::kBf16, fusion});
}

float f(double v) { return static_cast<float>(v); }

// C[M,N] = sum_k a(i, k) * b(k, j) exactly, with the premise that FP32 computes each sum exactly.
template <typename A, typename B>
std::vector<double> exact_matmul(int64_t M, int64_t N, int64_t K, A a, B b) {
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      std::vector<double> terms;
      for (int64_t k = 0; k < K; ++k) terms.push_back(a(i, k) * b(k, j));
      EXPECT_TRUE(testing::sums_exact_in_fp32(terms))
          << "premise: FP32 sums exactly, (" << i << ", " << j << ")";
      double sum = 0.0;
      for (double t : terms) sum += t;
      c[static_cast<size_t>(i * N + j)] = sum;
    }
  }
  return c;
}

TEST(RoundingReference, DefinitionOnKnownEncodings) {
  auto rne = [](uint32_t bits) {
    return std::bit_cast<uint32_t>(testing::bf16_nearest_even(std::bit_cast<float>(bits)));
  };
  EXPECT_EQ(rne(0x3f808000u), 0x3f800000u);  // 1 + 2^-8: a tie, the even neighbour 1 stays
  EXPECT_EQ(rne(0x3f818000u), 0x3f820000u);  // a tie next to an odd last bit goes up
  EXPECT_EQ(rne(0x3f808001u), 0x3f810000u);  // above the tie
  EXPECT_EQ(rne(0xbf818000u), 0xbf820000u);  // negative: away from zero on the odd tie
  EXPECT_EQ(rne(0x3f7fffffu), 0x3f800000u);  // the carry moves the exponent
  EXPECT_EQ(rne(0x7f7fffffu), 0x7f800000u);  // past the largest finite BF16: infinity
  EXPECT_TRUE(testing::is_bf16(1.0 + 0x1p-7));
  EXPECT_FALSE(testing::is_bf16(1.0 + 0x1p-8));
  EXPECT_TRUE(testing::is_fp32(1.0 + 0x1p-23));
  EXPECT_FALSE(testing::is_fp32(1.0 + 0x1p-24));
}

// Backend::round: states to FP32; compute weights and activations to BF16 through FP32 (two roundings).
TEST(RoundingPoints, StorageOfEachRole) {
  auto backend = bf16_backend();
  std::vector<double> x;
  for (int i = 0; i < 64; ++i) x.push_back(std::sin(0.37 * i + 0.1) * std::ldexp(1.0, i % 9 - 4));
  // 1 + 2^-8 + 2^-30: FP32 drops 2^-30 and leaves a BF16 tie that goes to 1; one direct rounding of
  // the double would give 1 + 2^-7.
  x.push_back(1.0 + 0x1p-8 + 0x1p-30);
  Expected state, bf16_copy;
  for (double v : x) {
    state.fp32(f(v));
    bf16_copy.bf16_of(f(v));
  }
  EXPECT_EQ(bf16_copy.values.back(), 1.0);
  for (TensorRole role : {TensorRole::kComputeWeight, TensorRole::kActivation, TensorRole::kState}) {
    std::vector<double> y = x;
    backend->round(role, y.data(), static_cast<int64_t>(y.size()));
    if (role == TensorRole::kState) {
      expect_stored(y, state, Format::kFp32, "state (master weights, main grads, moments)");
      int64_t beyond_bf16 = 0;  // an FP32 state keeps bits a BF16 one would lose
      for (double v : y) beyond_bf16 += !testing::is_bf16(v);
      EXPECT_GT(beyond_bf16, 0);
    } else {
      expect_stored(y, bf16_copy, Format::kBf16,
                    role == TensorRole::kComputeWeight ? "compute weight" : "activation");
    }
  }
}

// ---- GEMMs: BF16 inputs, FP32 accumulation, one rounding of the output -------------------------------

// x: integers -15..15 / 8, W: -15..15 / 16. Dot products of 16 need up to 12 significant bits.
constexpr int64_t kRows = 6, kIn = 16, kOut = 12;

TEST(RoundingPoints, LinearForwardIsTheFp32GemmRoundedOnceToBf16) {
  auto backend = bf16_backend();
  const std::vector<double> x = testing::small_multiples(kRows * kIn, 15, 3, 1);
  const std::vector<double> w = testing::small_multiples(kOut * kIn, 15, 4, 2);
  std::vector<double> y(static_cast<size_t>(kRows * kOut));
  backend->linear_forward(x.data(), w.data(), kRows, kIn, kOut, y.data());
  const std::vector<double> exact = exact_matmul(
      kRows, kOut, kIn, [&](int64_t i, int64_t k) { return x[static_cast<size_t>(i * kIn + k)]; },
      [&](int64_t k, int64_t j) { return w[static_cast<size_t>(j * kIn + k)]; });
  Expected want;
  for (double v : exact) want.bf16_of(f(v));  // f(v) == v: the premise
  expect_stored(y, want, Format::kBf16, "linear_forward y");
}

// dx = dy W rounded once to BF16; dW added to the FP32 main gradient: with fusion the FP32 GEMM result
// itself (one FP32 rounding of main + result), without fusion that result first rounded to BF16.
TEST(RoundingPoints, LinearBackwardDxInBf16AndWeightGradientInFp32MainGrad) {
  const std::vector<double> dy = testing::small_multiples(kRows * kOut, 15, 3, 3);
  const std::vector<double> x = testing::small_multiples(kRows * kIn, 15, 3, 4);
  const std::vector<double> w = testing::small_multiples(kOut * kIn, 15, 4, 5);
  std::vector<double> main_grad;  // FP32 values from an earlier micro-batch, not BF16
  for (int64_t i = 0; i < kOut * kIn; ++i)
    main_grad.push_back(f(std::cos(0.3 * static_cast<double>(i)) / 3.0));
  const std::vector<double> dx_exact = exact_matmul(
      kRows, kIn, kOut, [&](int64_t i, int64_t k) { return dy[static_cast<size_t>(i * kOut + k)]; },
      [&](int64_t k, int64_t j) { return w[static_cast<size_t>(k * kIn + j)]; });
  const std::vector<double> dw_exact = exact_matmul(
      kOut, kIn, kRows, [&](int64_t i, int64_t k) { return dy[static_cast<size_t>(k * kOut + i)]; },
      [&](int64_t k, int64_t j) { return x[static_cast<size_t>(k * kIn + j)]; });
  Expected dx_want, fused_want, unfused_want;
  for (double v : dx_exact) dx_want.bf16_of(f(v));
  for (size_t i = 0; i < dw_exact.size(); ++i) {
    fused_want.fp32(f(main_grad[i]) + f(dw_exact[i]));
    unfused_want.fp32(f(main_grad[i]) + f(bf16(f(dw_exact[i]))));
  }
  int64_t fusion_matters = 0;
  for (size_t i = 0; i < dw_exact.size(); ++i)
    fusion_matters += fused_want.values[i] != unfused_want.values[i];
  EXPECT_GT(fusion_matters, 0) << "the inputs cannot tell fusion on from off";
  for (bool fusion : {true, false}) {
    auto backend = bf16_backend(fusion);
    std::vector<double> dx(static_cast<size_t>(kRows * kIn)), dw = main_grad;
    backend->linear_backward(dy.data(), x.data(), w.data(), kRows, kIn, kOut, dx.data(), dw.data());
    expect_stored(dx, dx_want, Format::kBf16, "linear_backward dx");
    expect_stored(dw, fusion ? fused_want : unfused_want, Format::kFp32,
                  fusion ? "dW main grad, fusion on" : "dW main grad, fusion off");
  }
}

// ---- RMSNorm: FP32 statistics, BF16 output; backward BF16 dx, FP32 weight gradient ------------------

constexpr int64_t kN = 5, kH = 24;

TEST(RoundingPoints, RmsNormForwardFp32StatisticsAndBf16Output) {
  auto backend = bf16_backend();
  const std::vector<double> x = testing::bf16_values(kN * kH, 3.0, 6), w = testing::bf16_values(kH, 1.5, 7);
  const double eps = 1e-5;
  std::vector<double> y(static_cast<size_t>(kN * kH)), rstd(static_cast<size_t>(kN));
  backend->rmsnorm_forward(x.data(), w.data(), kN, kH, eps, y.data(), rstd.data());
  Expected y_want, rstd_want;
  for (int64_t n = 0; n < kN; ++n) {
    float sum_squares = 0.0f;
    for (int64_t i = 0; i < kH; ++i) sum_squares += f(x[n * kH + i]) * f(x[n * kH + i]);
    const float inv = 1.0f / std::sqrt(sum_squares / static_cast<float>(kH) + f(eps));
    rstd_want.fp32(inv);
    for (int64_t i = 0; i < kH; ++i) y_want.bf16_of(f(x[n * kH + i]) * inv * f(w[i]));
  }
  expect_stored(rstd, rstd_want, Format::kFp32, "rmsnorm rstd");
  expect_stored(y, y_want, Format::kBf16, "rmsnorm y");
}

TEST(RoundingPoints, RmsNormBackwardBf16DxAndFp32WeightGradient) {
  auto backend = bf16_backend();
  const std::vector<double> x = testing::bf16_values(kN * kH, 3.0, 8), w = testing::bf16_values(kH, 1.5, 9);
  const std::vector<double> dy = testing::bf16_values(kN * kH, 0.5, 10);
  std::vector<double> y(static_cast<size_t>(kN * kH)), rstd(static_cast<size_t>(kN));
  backend->rmsnorm_forward(x.data(), w.data(), kN, kH, 1e-5, y.data(), rstd.data());
  std::vector<double> dx(static_cast<size_t>(kN * kH)), dw(static_cast<size_t>(kH), 0.0);
  for (int64_t i = 0; i < kH; ++i) dw[i] = f(0.01 * static_cast<double>(i) / 3.0);  // earlier micro-batches
  Expected dx_want, dw_want;
  std::vector<float> dw_ref(dw.begin(), dw.end());
  for (int64_t n = 0; n < kN; ++n) {
    const float inv = f(rstd[n]);
    float mean = 0.0f;
    for (int64_t i = 0; i < kH; ++i) mean += f(dy[n * kH + i]) * f(w[i]) * f(x[n * kH + i]) * inv;
    mean /= static_cast<float>(kH);
    for (int64_t i = 0; i < kH; ++i) {
      const float xhat = f(x[n * kH + i]) * inv;
      dx_want.bf16_of(inv * (f(dy[n * kH + i]) * f(w[i]) - xhat * mean));
      dw_ref[i] += f(dy[n * kH + i]) * xhat;
    }
  }
  for (float v : dw_ref) dw_want.fp32(v);
  backend->rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), kN, kH, dx.data(), dw.data());
  expect_stored(dx, dx_want, Format::kBf16, "rmsnorm dx");
  expect_stored(dw, dw_want, Format::kFp32, "rmsnorm dw main grad");
}

// ---- RoPE, SwiGLU, the residual add, dropout: FP32 arithmetic, BF16 output ---------------------------

TEST(RoundingPoints, RopeRotatesInFp32AndStoresBf16) {
  auto backend = bf16_backend();
  const int64_t windows = 2, heads = 3, seq = 5, D = 8;
  const double theta = 10000.0;
  const std::vector<int32_t> positions{0, 1, 2, 3, 4, 7, 9, 11, 200, 3001};
  const std::vector<double> x = testing::bf16_values(windows * heads * seq * D, 2.0, 11);
  for (bool inverse : {false, true}) {
    Expected want;
    want.values.assign(x.size(), 0.0);
    for (int64_t b = 0; b < windows; ++b) {
      for (int64_t t = 0; t < seq; ++t) {
        for (int64_t i = 0; i < D / 2; ++i) {
          const double angle = positions[b * seq + t] *
                               std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
          const float c = f(std::cos(angle)), s = f((inverse ? -1.0 : 1.0) * std::sin(angle));
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t base = ((b * heads + h) * seq + t) * D;
            const float x1 = f(x[base + i]), x2 = f(x[base + i + D / 2]);
            Expected pair;
            pair.bf16_of(x1 * c - x2 * s);
            pair.bf16_of(x2 * c + x1 * s);
            want.values[base + i] = pair.values[0];
            want.values[base + i + D / 2] = pair.values[1];
            want.rounded += pair.rounded;
            want.not_truncated += pair.not_truncated;
          }
        }
      }
    }
    std::vector<double> y = x;
    backend->rope(y.data(), positions.data(), windows, heads, seq, D, theta, inverse);
    expect_stored(y, want, Format::kBf16, inverse ? "rope inverse" : "rope");
  }
}

TEST(RoundingPoints, SwigluForwardAndBackwardStoreBf16) {
  auto backend = bf16_backend();
  const int64_t rows = 4, F = 20;
  const std::vector<double> fc1 = testing::bf16_values(rows * 2 * F, 4.0, 12);
  const std::vector<double> dact = testing::bf16_values(rows * F, 1.0, 13);
  Expected act_want, dfc1_want;
  dfc1_want.values.assign(fc1.size(), 0.0);
  Expected dgate, dup;
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t i = 0; i < F; ++i) {
      const float g = f(fc1[n * 2 * F + i]), u = f(fc1[n * 2 * F + F + i]), d = f(dact[n * F + i]);
      const float sigmoid = 1.0f / (1.0f + std::exp(-g));
      act_want.bf16_of(g * sigmoid * u);
      dgate.bf16_of(d * u * sigmoid * (1.0f + g * (1.0f - sigmoid)));
      dup.bf16_of(d * g * sigmoid);
      dfc1_want.values[n * 2 * F + i] = dgate.values.back();
      dfc1_want.values[n * 2 * F + F + i] = dup.values.back();
    }
  }
  dfc1_want.rounded = dgate.rounded + dup.rounded;
  dfc1_want.not_truncated = dgate.not_truncated + dup.not_truncated;
  std::vector<double> act(static_cast<size_t>(rows * F)), dfc1(fc1.size()), act_again(act.size());
  backend->swiglu_forward(fc1.data(), rows, F, act.data());
  backend->swiglu_backward(dact.data(), fc1.data(), rows, F, dfc1.data(), act_again.data());
  expect_stored(act, act_want, Format::kBf16, "swiglu act");
  expect_stored(act_again, act_want, Format::kBf16, "swiglu act (backward)");
  expect_stored(dfc1, dfc1_want, Format::kBf16, "swiglu dfc1");
}

TEST(RoundingPoints, ResidualAddStoresBf16) {
  auto backend = bf16_backend();
  const std::vector<double> x = testing::bf16_values(96, 8.0, 14), y = testing::bf16_values(96, 0.3, 15);
  Expected want;
  for (size_t i = 0; i < x.size(); ++i) want.bf16_of(f(x[i]) + f(y[i]));
  std::vector<double> sum = x;
  backend->add_inplace(sum.data(), y.data(), static_cast<int64_t>(sum.size()));
  expect_stored(sum, want, Format::kBf16, "residual add");
}

// x * (1/(1-p) in FP32) in FP32, stored in BF16; the same for the gradient.
TEST(RoundingPoints, HiddenDropoutStoresBf16) {
  auto backend = bf16_backend();
  const double p = 0.1;
  const int64_t seq = 8, hidden = 16;
  const std::vector<int64_t> samples{3};
  std::vector<double> keep(static_cast<size_t>(seq * hidden));
  backend->hidden_dropout_mask(DropoutSite{stream_key(5, "rounding"), p, samples.data()}, 0, seq, seq, hidden,
                               keep.data());
  const float kept = f(1.0 / (1.0 - p));
  const std::vector<double> x = testing::bf16_values(keep.size(), 2.0, 16);
  Expected want;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(keep[i] == 0.0 || keep[i] == static_cast<double>(kept)) << keep[i];
    want.bf16_of(f(x[i]) * f(keep[i]));
  }
  std::vector<double> y(x.size()), dx(x.size());
  backend->dropout_forward(x.data(), keep.data(), static_cast<int64_t>(x.size()), y.data());
  backend->dropout_backward(x.data(), keep.data(), static_cast<int64_t>(x.size()), dx.data());
  expect_stored(y, want, Format::kBf16, "hidden dropout forward");
  expect_stored(dx, want, Format::kBf16, "hidden dropout backward");
}

// ---- embedding: the BF16 compute weight itself; its gradient FP32 --------------------------------------

TEST(RoundingPoints, EmbeddingOutputIsTheBf16WeightAndItsGradientFp32) {
  auto backend = bf16_backend();
  const int64_t hidden = 8, rows = 7, vocab_start = 3, vocab_local = 5;  // a tp slice [3, 8) of 10
  const std::vector<int32_t> tokens{3, 7, 0, 5, 5, 9, 4};
  const std::vector<double> table = testing::bf16_values(vocab_local * hidden, 1.0, 17);
  std::vector<double> y(static_cast<size_t>(rows * hidden));
  backend->embedding_forward(tokens.data(), table.data(), rows, hidden, vocab_start, vocab_local, y.data());
  Expected y_want;
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t local = tokens[n] - vocab_start;
    for (int64_t i = 0; i < hidden; ++i)
      y_want.values.push_back(local >= 0 && local < vocab_local ? table[local * hidden + i] : 0.0);
  }
  y_want.rounds = false;
  expect_stored(y, y_want, Format::kBf16, "embedding y");

  const std::vector<double> dy = testing::bf16_values(rows * hidden, 0.7, 18);
  std::vector<double> dtable(table.size());
  for (size_t i = 0; i < dtable.size(); ++i) dtable[i] = f(std::sin(static_cast<double>(i)) / 7.0);
  std::vector<float> ref(dtable.begin(), dtable.end());  // token 5 twice: the FP32 sum in row order
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t local = tokens[n] - vocab_start;
    if (local < 0 || local >= vocab_local) continue;
    for (int64_t i = 0; i < hidden; ++i) ref[local * hidden + i] += f(dy[n * hidden + i]);
  }
  Expected dtable_want;
  for (float v : ref) dtable_want.fp32(v);
  backend->embedding_backward(tokens.data(), dy.data(), rows, hidden, vocab_start, vocab_local,
                              dtable.data());
  expect_stored(dtable, dtable_want, Format::kFp32, "embedding dtable main grad");
}

// ---- cross entropy: FP32 on the BF16 logits; dlogits stored in BF16 ---------------------------------

TEST(RoundingPoints, CrossEntropyInFp32WithBf16Dlogits) {
  auto backend = bf16_backend();
  const int64_t rows = 4, V = 24, vocab_start = 0;
  const std::vector<double> logits = testing::bf16_values(rows * V, 6.0, 19);
  const std::vector<int32_t> targets{3, -100, 23, 0};
  const double loss_weight = 1.0 / 3.0;
  std::vector<double> row_max(rows), sum_exp(rows), target_logit(rows), losses(rows), dlogits(logits.size());
  backend->logits_row_max(logits.data(), rows, V, row_max.data());
  backend->cross_entropy_partials(logits.data(), targets.data(), rows, V, vocab_start, row_max.data(),
                                  sum_exp.data(), target_logit.data());
  backend->cross_entropy_loss(row_max.data(), sum_exp.data(), target_logit.data(), targets.data(), rows,
                              losses.data());
  backend->cross_entropy_backward(logits.data(), targets.data(), rows, V, vocab_start, row_max.data(),
                                  sum_exp.data(), loss_weight, dlogits.data());
  Expected max_want, sum_want, loss_want, d_want;
  for (int64_t n = 0; n < rows; ++n) {
    float m = f(logits[n * V]);
    for (int64_t i = 1; i < V; ++i) m = std::max(m, f(logits[n * V + i]));
    float z = 0.0f;
    for (int64_t i = 0; i < V; ++i) z += std::exp(f(logits[n * V + i]) - m);
    max_want.fp32(m);
    sum_want.fp32(z);
    const bool ignored = targets[n] == -100;
    loss_want.fp32(ignored ? 0.0f : std::log(z) + m - f(logits[n * V + targets[n]]));
    for (int64_t i = 0; i < V; ++i) {
      float d = f(loss_weight) * std::exp(f(logits[n * V + i]) - m) / z;
      if (i == targets[n]) d -= f(loss_weight);
      if (ignored) {
        d_want.values.push_back(0.0);
      } else {
        d_want.bf16_of(d);
      }
    }
  }
  expect_stored(row_max, max_want, Format::kFp32, "logits row max");
  expect_stored(sum_exp, sum_want, Format::kFp32, "cross entropy sum_exp");
  expect_stored(losses, loss_want, Format::kFp32, "cross entropy token losses");
  expect_stored(dlogits, d_want, Format::kBf16, "dlogits");
}

// ---- AdamW: moments and the update in FP32 on the FP32 master weights -----------------------------

TEST(RoundingPoints, AdamWMomentsAndMasterWeightsInFp32) {
  auto backend = bf16_backend();
  const int64_t n = 64;
  std::vector<double> param(n), grad(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    const auto x = static_cast<double>(i);
    param[i] = f(std::sin(0.7 * x) / 3.0);
    grad[i] = f(std::cos(1.3 * x) / 7.0);  // an FP32 main grad
    m[i] = f(std::sin(2.1 * x) / 50.0);
    v[i] = f(std::abs(std::cos(0.9 * x)) / 900.0);
  }
  AdamWStep step{1e-3, 0.9, 0.95, 1e-8, 0.1, 3};
  step.grad_scale = 0.8125;  // a clip coefficient: the gradient is read as grad * 0.8125 in double
  Expected p_want, m_want, v_want;
  const float b1 = f(step.beta1), b2 = f(step.beta2), lr = f(step.lr), eps = f(step.eps),
              wd = f(step.weight_decay);
  const float c1 = f(1.0 - std::pow(step.beta1, 3.0)), c2 = f(1.0 - std::pow(step.beta2, 3.0));
  for (int64_t i = 0; i < n; ++i) {
    const float g = f(grad[i] * step.grad_scale);
    const float mi = b1 * f(m[i]) + (1.0f - b1) * g;
    const float vi = b2 * f(v[i]) + (1.0f - b2) * g * g;
    float p = f(param[i]) * (1.0f - lr * wd);
    p -= lr * (mi / c1) / (std::sqrt(vi / c2) + eps);
    p_want.fp32(p);
    m_want.fp32(mi);
    v_want.fp32(vi);
  }
  backend->adamw_update(param.data(), grad.data(), m.data(), v.data(), n, step);
  expect_stored(param, p_want, Format::kFp32, "master weights");
  expect_stored(m, m_want, Format::kFp32, "exp_avg");
  expect_stored(v, v_want, Format::kFp32, "exp_avg_sq");
}

}  // namespace
}  // namespace touchstone
