// Dropout: the mapping from global coordinates to Philox words, the masks' statistics, a head, a row
// block or a window drawn alone equal to its slice of the full mask, p = 0 as the identity, the
// rounding point, and in the model: dropout changes the loss, its masks follow the global sample
// index and do not depend on the micro-batch split.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/dropout_mask.h"
#include "model/params.h"
#include "model/transformer.h"
#include "oracle/train_step.h"
#include "test_support.h"

namespace touchstone {
namespace {

std::vector<double> zeros(int64_t n) { return std::vector<double>(static_cast<size_t>(n), 0.0); }

// Within `sigmas` standard deviations of Binomial(n, q): a correct mask fails with probability below
// 2e-9 at 6 sigma, while a wrong keep probability or a repeated mask is off by hundreds of sigmas.
void expect_binomial(int64_t count, int64_t n, double q, const std::string& what, double sigmas = 6.0) {
  const double mean = static_cast<double>(n) * q, sd = std::sqrt(static_cast<double>(n) * q * (1.0 - q));
  EXPECT_LE(std::abs(static_cast<double>(count) - mean), sigmas * sd)
      << what << ": " << count << " of " << n << ", expected " << mean << " +- " << sd;
}

TEST(DropoutMask, FollowsTheDocumentedPhiloxCounterLayout) {
  const PhiloxKey key = stream_key(1234, "dropout/attention/layer0");
  // Element e of sample k: block e/2 in counter words 0-1, k in words 2-3; words (0,1) for even e,
  // (2,3) for odd e. High words exercised with k, e >= 2^32.
  for (const auto& [sample, element] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 0}, {0, 1}, {5, 7}, {0x100000003ull, 0x200000001ull}, {0x100000003ull, 0x200000002ull}}) {
    const uint64_t block = element / 2;
    const PhiloxCounter w =
        philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                       static_cast<uint32_t>(sample), static_cast<uint32_t>(sample >> 32)},
                      key);
    const double expected =
        element % 2 == 0 ? uniform_from_words(w[0], w[1]) : uniform_from_words(w[2], w[3]);
    EXPECT_EQ(uniform_at(key, sample, element), expected) << sample << ", " << element;
  }
  // Known answers, repeated in tests/python/test_torch_reference_selftest.py so that the PyTorch
  // reference draws the same masks.
  EXPECT_EQ(key, (PhiloxKey{0x2092ce47u, 0x490cfe60u}));
  EXPECT_EQ(stream_key(1234, "dropout/hidden_mlp/layer1"), (PhiloxKey{0x9c7408e9u, 0x4bb4a1f4u}));
  EXPECT_EQ(uniform_at(key, 0, 0), 0x1.889cfaab77a14p-2);
  EXPECT_EQ(uniform_at(key, 5, 7), 0x1.161d03c00b267p-1);
  EXPECT_EQ(uniform_at(stream_key(1234, "dropout/hidden_mlp/layer1"), 0x100000003ull, 0x200000001ull),
            0x1.0d5c3e3d8084ep-2);
}

TEST(DropoutMask, KeepFractionAndIndependenceAreWithinTheBinomialBound) {
  auto backend = make_cpu_backend();
  const double p = 0.1, kept = 1.0 / (1.0 - p);
  const int64_t windows = 16, T = 64, H = 1024, N = windows * T;  // 2^20 elements
  std::vector<int64_t> samples(static_cast<size_t>(windows));
  std::iota(samples.begin(), samples.end(), 100);
  auto hidden_mask = [&](const std::string& stream, const std::vector<int64_t>& s) {
    std::vector<double> mask = zeros(N * H);
    backend->hidden_dropout_mask(DropoutSite{stream_key(1234, stream), p, s.data()}, 0, N, T, H, mask.data());
    return mask;
  };
  const std::vector<double> mask = hidden_mask("dropout/hidden_mlp/layer0", samples);
  int64_t kept_count = 0;
  for (double m : mask) {
    ASSERT_TRUE(m == 0.0 || m == kept) << m;
    kept_count += m != 0.0;
  }
  expect_binomial(kept_count, N * H, 1.0 - p, "kept elements");

  // Independent masks drop an element in both with probability p^2; a repeated or correlated mask
  // (another sample, layer or site drawing the same words) would give p.
  std::vector<int64_t> next_samples = samples;
  for (int64_t& s : next_samples) s += windows;
  auto both_dropped = [&](const std::vector<double>& other) {
    int64_t count = 0;
    for (size_t i = 0; i < mask.size(); ++i) count += mask[i] == 0.0 && other[i] == 0.0;
    return count;
  };
  expect_binomial(both_dropped(hidden_mask("dropout/hidden_mlp/layer0", next_samples)), N * H, p * p,
                  "dropped in the masks of two steps");
  expect_binomial(both_dropped(hidden_mask("dropout/hidden_mlp/layer1", samples)), N * H, p * p,
                  "dropped in two layers' masks");
  expect_binomial(both_dropped(hidden_mask("dropout/hidden_attn/layer0", samples)), N * H, p * p,
                  "dropped in two sites' masks");
  int64_t pairs_dropped = 0;  // the two elements of one Philox block use different words
  for (size_t i = 0; i < mask.size(); i += 2) pairs_dropped += mask[i] == 0.0 && mask[i + 1] == 0.0;
  expect_binomial(pairs_dropped, N * H / 2, p * p, "dropped in both halves of a Philox block");

  // The attention mask, at another p: [b, NH, T, T] with b = 8, NH = 8, T = 64 (2^18 elements).
  const double pa = 0.3;
  const AttentionShape shape{8, T, 8, 4, 8};
  std::vector<double> attention = zeros(8 * 8 * T * T);
  fill_attention_dropout_mask(DropoutSite{stream_key(1234, "dropout/attention/layer0"), pa, samples.data()},
                              shape, 0, Precision::kFp64, attention.data());
  int64_t attention_kept = 0;
  for (double m : attention) attention_kept += m == 1.0 / (1.0 - pa);
  expect_binomial(attention_kept, static_cast<int64_t>(attention.size()), 1.0 - pa, "kept probabilities");
}

TEST(DropoutMask, ASliceDrawnAloneEqualsItsSliceOfTheFullMask) {
  auto backend = make_cpu_backend();
  const std::vector<int64_t> samples{10, 11, 12};
  const PhiloxKey key = stream_key(7, "dropout/attention/layer3");
  const int64_t T = 16, NH = 4;

  // Attention: tensor parallelism holds heads [2, 4) of 4; a micro-batch of one window holds sample 11.
  const AttentionShape full_shape{3, T, NH, 2, 4};
  std::vector<double> full = zeros(3 * NH * T * T), again = full;
  fill_attention_dropout_mask(DropoutSite{key, 0.25, samples.data()}, full_shape, 0, Precision::kFp64,
                              full.data());
  fill_attention_dropout_mask(DropoutSite{key, 0.25, samples.data()}, full_shape, 0, Precision::kFp64,
                              again.data());
  EXPECT_EQ(full, again);  // a pure function of the coordinates
  const AttentionShape two_heads{3, T, 2, 1, 4};
  std::vector<double> heads = zeros(3 * 2 * T * T);
  fill_attention_dropout_mask(DropoutSite{key, 0.25, samples.data()}, two_heads, 2, Precision::kFp64,
                              heads.data());
  for (int64_t w = 0; w < 3; ++w) {
    const auto first = full.begin() + (w * NH + 2) * T * T;
    EXPECT_TRUE(std::equal(first, first + 2 * T * T, heads.begin() + w * 2 * T * T)) << "window " << w;
  }
  const AttentionShape one_window{1, T, NH, 2, 4};
  std::vector<double> window = zeros(NH * T * T);
  fill_attention_dropout_mask(DropoutSite{key, 0.25, samples.data() + 1}, one_window, 0, Precision::kFp64,
                              window.data());
  EXPECT_TRUE(std::equal(window.begin(), window.end(), full.begin() + NH * T * T));

  // Hidden: sequence parallelism over 4 ranks holds blocks of 12 of the 48 rows, some across a window
  // edge (T = 16); a micro-batch of one window holds rows 32..47.
  const int64_t H = 8, N = 3 * T;
  std::vector<double> rows = zeros(N * H);
  backend->hidden_dropout_mask(DropoutSite{key, 0.25, samples.data()}, 0, N, T, H, rows.data());
  for (int64_t rank = 0; rank < 4; ++rank) {
    std::vector<double> block = zeros(12 * H);
    backend->hidden_dropout_mask(DropoutSite{key, 0.25, samples.data()}, rank * 12, 12, T, H, block.data());
    EXPECT_TRUE(std::equal(block.begin(), block.end(), rows.begin() + rank * 12 * H)) << "rank " << rank;
  }
  std::vector<double> last = zeros(T * H);
  backend->hidden_dropout_mask(DropoutSite{key, 0.25, samples.data() + 2}, 0, T, T, H, last.data());
  EXPECT_TRUE(std::equal(last.begin(), last.end(), rows.begin() + 2 * T * H));
}

TEST(Dropout, ZeroProbabilityIsTheIdentityBitwise) {
  auto backend = make_cpu_backend();
  const std::vector<int64_t> samples{0, 1};
  const AttentionShape s{2, 8, 2, 1, 4};
  std::vector<double> mask = zeros(2 * 2 * 8 * 8);
  const DropoutSite off{stream_key(1, "a"), 0.0, samples.data()};
  fill_attention_dropout_mask(off, s, 0, Precision::kFp64, mask.data());
  for (double m : mask) ASSERT_EQ(m, 1.0);
  // Attention dropout at p = 0 is attention without dropout, bitwise, forward and backward.
  std::vector<double> q = zeros(2 * 2 * 8 * 4), kv = zeros(2 * 8 * 4);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7 * static_cast<double>(i));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.3 * static_cast<double>(i));
  const std::vector<int32_t> documents(16, 0);
  const AttentionDropout zero_probability{off, 1};
  std::vector<double> out_plain = zeros(16 * 8), out_zero = out_plain, lse_plain = zeros(2 * 2 * 8),
                      lse_zero = lse_plain;
  backend->attention_forward(q.data(), kv.data(), kv.data(), documents.data(), true, AttentionDropout{}, s,
                             out_plain.data(), lse_plain.data());
  backend->attention_forward(q.data(), kv.data(), kv.data(), documents.data(), true, zero_probability, s,
                             out_zero.data(), lse_zero.data());
  EXPECT_EQ(out_plain, out_zero);
  EXPECT_EQ(lse_plain, lse_zero);
  std::vector<double> dq_plain = q, dq_zero = q, dk_plain = kv, dk_zero = kv, dv_plain = kv, dv_zero = kv;
  backend->attention_backward(out_plain.data(), q.data(), kv.data(), kv.data(), out_plain.data(),
                              lse_plain.data(), documents.data(), true, AttentionDropout{}, s,
                              dq_plain.data(), dk_plain.data(), dv_plain.data());
  backend->attention_backward(out_plain.data(), q.data(), kv.data(), kv.data(), out_plain.data(),
                              lse_plain.data(), documents.data(), true, zero_probability, s, dq_zero.data(),
                              dk_zero.data(), dv_zero.data());
  EXPECT_EQ(dq_plain, dq_zero);
  EXPECT_EQ(dk_plain, dk_zero);
  EXPECT_EQ(dv_plain, dv_zero);
  // Hidden dropout at p = 0 leaves its input bitwise.
  std::vector<double> hidden_mask = zeros(16 * 4), y = zeros(16 * 4);
  backend->hidden_dropout_mask(DropoutSite{stream_key(1, "b"), 0.0, samples.data()}, 0, 16, 8, 4,
                               hidden_mask.data());
  backend->dropout_forward(q.data(), hidden_mask.data(), 64, y.data());
  EXPECT_TRUE(std::equal(y.begin(), y.end(), q.begin()));
}

TEST(Dropout, AttentionDropsTheProbabilitiesThatMultiplyV) {
  // out[i] = sum_j P[i,j] M[i,j] V[j] for one window and head, with P = exp(s - lse) from the kernel's
  // own lse and M the documented mask.
  auto backend = make_cpu_backend();
  const int64_t T = 8, D = 4;
  const AttentionShape s{1, T, 1, 1, D};
  const std::vector<int64_t> samples{3};
  std::vector<double> q = zeros(T * D), k = q, v = q, mask = zeros(T * T), lse = zeros(T), out = q;
  for (int64_t i = 0; i < T * D; ++i) {
    q[i] = std::sin(1.3 * static_cast<double>(i));
    k[i] = std::cos(0.4 * static_cast<double>(i));
    v[i] = std::sin(0.9 * static_cast<double>(i) + 1.0);
  }
  const DropoutSite site{stream_key(5, "c"), 0.4, samples.data()};
  fill_attention_dropout_mask(site, s, 0, Precision::kFp64, mask.data());
  const std::vector<int32_t> documents(T, 0);
  backend->attention_forward(q.data(), k.data(), v.data(), documents.data(), true, AttentionDropout{site, 0},
                             s, out.data(), lse.data());
  int64_t dropped_visible = 0;
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t d = 0; d < D; ++d) {
      double expected = 0.0, magnitude = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        double score = 0.0;
        for (int64_t e = 0; e < D; ++e) score += q[i * D + e] * k[j * D + e];
        const double p = std::exp(score * s.scale() - lse[i]);
        expected += p * mask[i * T + j] * v[j * D + d];
        magnitude += std::abs(p * mask[i * T + j] * v[j * D + d]);
      }
      // The scores (D = 4 terms), lse (T = 8 terms and a log) and exp here and in the kernel differ by a
      // few roundings each, and the sums of at most 8 products run in different orders: within 64u of
      // sum |terms| (|score| < 4 here, so exp's relative error stays a few u).
      EXPECT_NEAR(out[i * D + d], expected, 64 * 0x1p-53 * magnitude) << i << ", " << d;
    }
    for (int64_t j = 0; j <= i; ++j) dropped_visible += mask[i * T + j] == 0.0;
  }
  EXPECT_GT(dropped_visible, 0);  // the check above saw dropped probabilities
}

TEST(Dropout, MultipliesInTheTensorsPrecision) {
  // BF16: x (BF16) * (1/(1-p) in FP32), computed in FP32, stored in BF16; backward is the same product.
  auto backend = make_cpu_backend(BackendOptions{Precision::kBf16});
  const std::vector<int64_t> samples{0};
  std::vector<double> mask = zeros(64), x = zeros(64), y = zeros(64), dx = zeros(64);
  backend->hidden_dropout_mask(DropoutSite{stream_key(2, "d"), 0.1, samples.data()}, 0, 8, 8, 8, mask.data());
  for (int64_t i = 0; i < 64; ++i) x[i] = round_to_bf16(1.0 + 0.37 * static_cast<double>(i));
  backend->dropout_forward(x.data(), mask.data(), 64, y.data());
  backend->dropout_backward(x.data(), mask.data(), 64, dx.data());
  const float scale = static_cast<float>(1.0 / 0.9);
  int64_t rounded = 0;
  for (int64_t i = 0; i < 64; ++i) {
    ASSERT_TRUE(mask[i] == 0.0 || mask[i] == static_cast<double>(scale));
    const double expected =
        mask[i] == 0.0 ? 0.0 : round_to_bf16(static_cast<double>(static_cast<float>(x[i]) * scale));
    EXPECT_EQ(y[i], expected) << i;
    EXPECT_EQ(dx[i], expected) << i;
    rounded += mask[i] != 0.0 && expected != x[i] / 0.9;
  }
  EXPECT_GT(rounded, 0);  // the BF16 rounding point is visible
}

// ---- in the model ----------------------------------------------------------------------------------

Config dropout_config(double attention, double hidden) {
  Config c = testing::tiny_config();
  c.model.attention_dropout = attention;
  c.model.hidden_dropout = hidden;
  return c;
}

std::vector<data::Document> documents() {
  return {{5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, {3, 4}, {15, 2, 9}, {7, 7, 8, 2, 3, 4, 5, 6, 11, 12, 13}};
}

ObjectiveResult objective(const Config& c, const GlobalBatch& batch, int64_t mbs) {
  auto backend = make_cpu_backend();
  const ParamTable table(c.model);
  const Transformer model = testing::whole_model(c, table, *backend);
  return evaluate_objective(model, table, init_parameters(table, c.model, 7), batch, mbs,
                            LossNormalization::kGlobalTokenMean, true);
}

TEST(DropoutInTheModel, ChangesTheLossAndFollowsTheSampleIndex) {
  const Config on = dropout_config(0.2, 0.2);
  const GlobalBatch batch = testing::batch_from_documents(on, documents());
  const double loss_on = objective(on, batch, 2).loss;
  // Measured relative changes 5e-3 to 5e-2; 1e-4 is far above rounding (1e-16) and below the effect.
  EXPECT_GT(std::abs(loss_on - objective(dropout_config(0.0, 0.0), batch, 2).loss) / loss_on, 1e-4);
  EXPECT_GT(std::abs(loss_on - objective(dropout_config(0.2, 0.0), batch, 2).loss) / loss_on, 1e-4);
  EXPECT_GT(std::abs(loss_on - objective(dropout_config(0.0, 0.2), batch, 2).loss) / loss_on, 1e-4);
  EXPECT_EQ(loss_on, objective(on, batch, 2).loss);  // deterministic
  // The same windows as samples of the next step draw other masks.
  GlobalBatch next_step = batch;
  for (int64_t& sample : next_step.sample_indices) sample += batch.windows;
  EXPECT_GT(std::abs(loss_on - objective(on, next_step, 2).loss) / loss_on, 1e-4);
  // Another seed draws other masks.
  Config other_seed = on;
  other_seed.train.seed += 1;
  EXPECT_GT(std::abs(loss_on - objective(other_seed, batch, 2).loss) / loss_on, 1e-4);
}

TEST(DropoutInTheModel, MasksDoNotDependOnTheMicroBatchSplit) {
  // As in test_training_step: regrouping at most B = 4 partial sums costs a few ulps, << 1e-13.
  const Config on = dropout_config(0.2, 0.2);
  const GlobalBatch batch = testing::batch_from_documents(on, documents());
  const ObjectiveResult whole = objective(on, batch, 4);
  for (int64_t mbs : {2, 1}) {
    const ObjectiveResult split = objective(on, batch, mbs);
    EXPECT_LE(std::abs(split.loss - whole.loss) / whole.loss, 1e-13) << "mbs " << mbs;
    EXPECT_LE(testing::relative_l2(split.grads, whole.grads), 1e-13) << "mbs " << mbs;
  }
}

TEST(DropoutInTheModel, NeedsTheSampleIndices) {
  const Config on = dropout_config(0.1, 0.0);
  auto backend = make_cpu_backend();
  const ParamTable table(on.model);
  const Transformer model = testing::whole_model(on, table, *backend);
  GlobalBatch batch = testing::batch_from_documents(on, documents());
  MicroBatch micro = batch.micro_batch(0, 2);
  micro.sample_indices = nullptr;
  Activations acts;
  EXPECT_THROW(model.forward(init_parameters(table, on.model, 7), micro, nullptr, acts),
               std::invalid_argument);
}

}  // namespace
}  // namespace touchstone
