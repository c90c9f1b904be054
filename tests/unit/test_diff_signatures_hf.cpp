// The diff's verdicts for mistakes made converting to another framework (Hugging Face, torchtitan),
// each on a synthetic candidate built with Touchstone's own trainer under the mistaken rule and diffed
// with run_analysis (as test_diff_signatures.cpp does for the other recomputed rules):
//   attention_mask_added   a 0/1 mask added to the attention scores: the trainer run with
//                          oracle/diff/added_mask.h's backend, itself checked against the formula and
//                          finite differences first;
//   targets_shifted_twice  the golden targets shifted once more (position i trained on targets[i+1]),
//                          normalised by the shifted targets' own counts (the trainer on the shifted
//                          batch) or by the golden counts (the trainer on each shifted micro-batch alone,
//                          its objective reweighted to the golden loss weights);
//   rope_adjacent_pairs    RoPE over each head's adjacent pairs, and rope_cosine_only, each pair scaled
//                          by its cosine: the trainer run with oracle/diff/rope_mistakes.h's backend,
//                          itself checked against rotate-half RoPE on permuted rows and against the
//                          formula first;
// Each case asserts the exact set of verdicts, so every other signature stays silent on it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/dropout_mask.h"
#include "oracle/diff/added_mask.h"
#include "oracle/diff/rope_mistakes.h"
#include "test_diff_signature_fixture.h"

namespace touchstone::diff::testing {
namespace {

// Step `step` of `config` computed by the trainer on `backend` from `params` (trainer_step's twin).
StepRecord trainer_step_on(Backend& backend, const Config& config, const ParamTensors& params, int64_t step,
                           const GlobalBatch& batch) {
  SingleProcessContext single;
  Trainer trainer(config, params, backend, single.context());
  const AdamWState zeros = AdamWState::zeros_like(params);
  trainer.restore(step - 1, params, zeros.exp_avg, zeros.exp_avg_sq);
  return trainer.step(batch, true);
}

// The golden targets as Hugging Face's labels= shifts them: position i gets targets[i + 1], the last
// position of every window -100.
GlobalBatch shifted_twice(GlobalBatch batch) {
  const std::vector<int32_t> targets = batch.targets;
  for (int64_t w = 0; w < batch.windows; ++w) {
    for (int64_t i = 0; i < batch.seq; ++i) {
      const auto at = static_cast<size_t>(w * batch.seq + i);
      batch.targets[at] = i + 1 < batch.seq ? targets[at + 1] : -100;
    }
  }
  return batch;
}

// Windows [first, first + count) of `batch` as a global batch of their own.
GlobalBatch windows_of(const GlobalBatch& batch, int64_t first, int64_t count) {
  GlobalBatch out;
  out.windows = count;
  out.seq = batch.seq;
  auto slice = [&](const auto& v, int64_t per) {
    return std::decay_t<decltype(v)>(v.begin() + first * per, v.begin() + (first + count) * per);
  };
  out.sample_indices = slice(batch.sample_indices, 1);
  out.tokens = slice(batch.tokens, batch.seq);
  out.targets = slice(batch.targets, batch.seq);
  out.position_ids = slice(batch.position_ids, batch.seq);
  out.document_ids = slice(batch.document_ids, batch.seq);
  return out;
}

// Deterministic pseudo-random numbers in [-1, 1) (splitmix64).
class Noise {
 public:
  double next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1p-52 - 1.0;
  }

 private:
  uint64_t state_ = 12345;
};

struct HfSignaturesFiles {
  static constexpr const char* kDirectory = "touchstone_signatures_hf";
};
class HfSignatures : public ThreeGoldenFiles<HfSignaturesFiles> {};

// The message of `signature` among the verdicts (empty when absent).
std::string message_of(const DiffResult& result, const std::string& signature) {
  for (const Verdict& v : result.verdicts) {
    if (v.signature == signature) return v.message;
  }
  return "";
}

// The backend's attention against its formula, evaluated directly: out = softmax over every key of
// (q k^T * scale + allowed) times v, with and without a dropout mask; and its backward against central
// differences of sum(out * w).
TEST(AddedMaskBackend, AttentionIsTheFormulaAndItsGradient) {
  const AttentionShape s{2, 5, 4, 2, 3};
  const int64_t T = s.seq, D = s.head_dim, NH = s.num_heads, NKV = s.num_kv_heads;
  const std::vector<int32_t> docs = {0, 0, 1, 1, 1, 4, 4, 4, -1, -1};  // [b, T]
  Noise noise;
  auto random = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = noise.next();
    return v;
  };
  std::vector<double> q = random(s.windows * NH * T * D), k = random(s.windows * NKV * T * D),
                      v = random(s.windows * NKV * T * D), w = random(s.windows * T * NH * D);
  // Attention dropout at p = 0.2 (keep 1.25): the mask the kernels draw, materialised.
  const std::vector<int64_t> samples{3, 8};
  const DropoutSite site{stream_key(11, "added_mask/dropout"), 0.2, samples.data()};
  std::vector<double> keep(static_cast<size_t>(s.windows * NH * T * T));
  fill_attention_dropout_mask(site, s, 0, Precision::kFp64, keep.data());
  AddedMaskBackend backend;
  for (const bool masking : {false, true}) {
    for (const bool dropout : {false, true}) {
      SCOPED_TRACE(std::string("document masking ") + (masking ? "on" : "off") +
                   (dropout ? ", dropout" : ", no dropout"));
      const double* keep_scale = dropout ? keep.data() : nullptr;
      const AttentionDropout attention_dropout = dropout ? AttentionDropout{site, 0} : AttentionDropout{};
      auto forward = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                         const std::vector<double>& vv, std::vector<double>* lse) {
        std::vector<double> out(w.size()), l(static_cast<size_t>(s.windows * NH * T));
        backend.attention_forward(qq.data(), kk.data(), vv.data(), docs.data(), masking, attention_dropout, s,
                                  out.data(), l.data());
        if (lse) *lse = l;
        return out;
      };
      std::vector<double> lse;
      const std::vector<double> out = forward(q, k, v, &lse);
      for (int64_t b = 0; b < s.windows; ++b) {
        for (int64_t h = 0; h < NH; ++h) {
          const int64_t g = h / (NH / NKV);
          for (int64_t i = 0; i < T; ++i) {
            std::vector<double> e(static_cast<size_t>(T));
            double sum = 0;
            for (int64_t j = 0; j < T; ++j) {
              double score = 0;
              for (int64_t d = 0; d < D; ++d) {
                score += q[static_cast<size_t>(((b * NH + h) * T + i) * D + d)] *
                         k[static_cast<size_t>(((b * NKV + g) * T + j) * D + d)];
              }
              const bool allowed = j <= i && (!masking || docs[static_cast<size_t>(b * T + j)] ==
                                                              docs[static_cast<size_t>(b * T + i)]);
              e[static_cast<size_t>(j)] =
                  std::exp(score / std::sqrt(static_cast<double>(D)) + (allowed ? 1 : 0));
              sum += e[static_cast<size_t>(j)];
            }
            EXPECT_NEAR(lse[static_cast<size_t>((b * NH + h) * T + i)], std::log(sum), 1e-14);
            for (int64_t d = 0; d < D; ++d) {
              double expected = 0;
              for (int64_t j = 0; j < T; ++j) {
                const auto pj = static_cast<size_t>(((b * NH + h) * T + i) * T + j);
                expected += e[static_cast<size_t>(j)] / sum * (keep_scale ? keep_scale[pj] : 1.0) *
                            v[static_cast<size_t>(((b * NKV + g) * T + j) * D + d)];
              }
              EXPECT_NEAR(out[static_cast<size_t>((b * T + i) * NH * D + h * D + d)], expected, 1e-13);
            }
          }
        }
      }
      std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
      backend.attention_backward(w.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), docs.data(),
                                 masking, attention_dropout, s, dq.data(), dk.data(), dv.data());
      auto objective = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                           const std::vector<double>& vv) {
        const std::vector<double> o = forward(qq, kk, vv, nullptr);
        double total = 0;
        for (size_t i = 0; i < o.size(); ++i) total += o[i] * w[i];
        return total;
      };
      constexpr double kStep = 1e-6;
      auto check = [&](std::vector<double>& x, const std::vector<double>& analytic, const char* name) {
        for (size_t i = 0; i < x.size(); ++i) {
          const double saved = x[i];
          x[i] = saved + kStep;
          const double up = objective(q, k, v);
          x[i] = saved - kStep;
          const double down = objective(q, k, v);
          x[i] = saved;
          EXPECT_NEAR(analytic[i], (up - down) / (2 * kStep), 1e-8) << name << "[" << i << "]";
        }
      };
      check(q, dq, "dq");
      check(k, dk, "dk");
      check(v, dv, "dv");
    }
  }
}

// Adjacent pairs are rotate-half on each head's elements permuted (2i <- i, 2i+1 <- i + D/2): the
// mistake is a layout, and the rotation is the golden one. The cosine-only form scales both elements of
// pair i by cos(pos theta^(-2i/D)). The backward (inverse) of each is its transpose: <R x, y> = <x, R^T y>.
TEST(RopeMistakeBackend, TheTwoFormsAgainstRotateHalfAndTheFormula) {
  const int64_t windows = 2, heads = 3, seq = 5, D = 8, half = D / 2;
  const double theta = 10000.0;
  const std::vector<int32_t> positions = {0, 1, 2, 0, 1, 7, 8, 9, 10, 3};  // [b, T]
  Noise noise;
  std::vector<double> x(static_cast<size_t>(windows * heads * seq * D)), y(x.size());
  for (double& v : x) v = noise.next();
  for (double& v : y) v = noise.next();
  auto rows = [&](const std::vector<double>& v, bool to_halves) {  // each head's D elements permuted
    std::vector<double> out(v.size());
    for (size_t r = 0; r < v.size() / D; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        const size_t pair_first = r * D + 2 * i, pair_second = pair_first + 1;
        const size_t half_first = r * D + i, half_second = half_first + half;
        if (to_halves) {
          out[half_first] = v[pair_first];
          out[half_second] = v[pair_second];
        } else {
          out[pair_first] = v[half_first];
          out[pair_second] = v[half_second];
        }
      }
    }
    return out;
  };
  const auto reference = make_cpu_backend(BackendOptions{});
  RopeMistakeBackend pairs(RopeMistake::kAdjacentPairs), cosine(RopeMistake::kCosineOnly);
  std::vector<double> by_pairs = x;
  pairs.rope(by_pairs.data(), positions.data(), windows, heads, seq, D, theta, false);
  std::vector<double> by_halves = rows(x, true);
  reference->rope(by_halves.data(), positions.data(), windows, heads, seq, D, theta, false);
  by_halves = rows(by_halves, false);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(by_pairs[i], by_halves[i], 1e-15) << i;
  std::vector<double> by_cosine = x;
  cosine.rope(by_cosine.data(), positions.data(), windows, heads, seq, D, theta, false);
  for (int64_t r = 0; r < windows * heads * seq; ++r) {
    const int64_t b = r / (heads * seq), t = r % seq;
    for (int64_t e = 0; e < D; ++e) {
      const double angle = positions[static_cast<size_t>(b * seq + t)] *
                           std::pow(theta, -2.0 * static_cast<double>(e % half) / static_cast<double>(D));
      EXPECT_NEAR(by_cosine[static_cast<size_t>(r * D + e)],
                  x[static_cast<size_t>(r * D + e)] * std::cos(angle), 1e-15);
    }
  }
  for (RopeMistakeBackend* backend : {&pairs, &cosine}) {
    std::vector<double> rx = x, rty = y;
    backend->rope(rx.data(), positions.data(), windows, heads, seq, D, theta, false);
    backend->rope(rty.data(), positions.data(), windows, heads, seq, D, theta, true);
    double left = 0, right = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      left += rx[i] * y[i];
      right += x[i] * rty[i];
    }
    EXPECT_NEAR(left, right, 1e-13) << backend->name();
  }
}

// A candidate trained with RoPE over adjacent pairs (torchtitan's convention on unpermuted golden
// weights), and one with RoPE's cosine alone (its complex table cast to float64): each named, nothing else.
TEST_F(HfSignatures, RopeAdjacentPairsAndCosineOnly) {
  for (const GoldenRun* golden : goldens()) {
    SCOPED_TRACE(golden->path);
    for (const auto& [mistake, signature] : {std::pair{RopeMistake::kAdjacentPairs, "rope_adjacent_pairs"},
                                             std::pair{RopeMistake::kCosineOnly, "rope_cosine_only"}}) {
      RopeMistakeBackend backend(mistake);
      const StepRecord record = trainer_step_on(backend, golden->config, golden->init, 1, golden->batch(1));
      const DiffResult result = analyse(*golden, dump(*golden, record), signature);
      expect_verdicts(result, {signature});
    }
  }
  // The pairs' message says what to do.
  RopeMistakeBackend backend(RopeMistake::kAdjacentPairs);
  const StepRecord record = trainer_step_on(backend, masked_->config, masked_->init, 1, masked_->batch(1));
  EXPECT_NE(message_of(analyse(*masked_, dump(*masked_, record), "pairs_message"), "rope_adjacent_pairs")
                .find("permute each head's q and k rows when loading"),
            std::string::npos);
}

TEST_F(HfSignatures, ACandidateEqualToTheGoldenStepPassesWithoutVerdicts) {
  for (const GoldenRun* golden : goldens()) {
    const DiffResult result = analyse(*golden, golden->step_datasets(1), "correct");
    EXPECT_EQ(result.exit_status(), 0) << describe(result);
    EXPECT_TRUE(result.verdicts.empty()) << describe(result);
  }
}

TEST_F(HfSignatures, AttentionMaskAdded) {
  for (const GoldenRun* golden : goldens()) {
    SCOPED_TRACE(golden->path);
    AddedMaskBackend backend;
    const StepRecord record = trainer_step_on(backend, golden->config, golden->init, 1, golden->batch(1));
    const DiffResult result = analyse(*golden, dump(*golden, record), "mask_added");
    expect_verdicts(result, {"attention_mask_added"});
    EXPECT_NE(message_of(result, "attention_mask_added")
                  .find("pass an additive mask: 0 where allowed, the dtype's minimum elsewhere "
                        "(touchstone.masks.hf_attention_mask)"),
              std::string::npos)
        << describe(result);
  }
}

// The data give the two normalisations of shifted targets different counts: each window's position 0
// holds a target, which the shift drops.
TEST_F(HfSignatures, TheShiftChangesEveryMicroBatchsCount) {
  const int64_t mbs = masked_->config.train.micro_batch_size;
  const GlobalBatch& batch = masked_->batch(1);
  const GlobalBatch shifted = shifted_twice(batch);
  for (int64_t start = 0; start < batch.windows; start += mbs) {
    EXPECT_NE(shifted.loss_tokens(start, mbs), batch.loss_tokens(start, mbs)) << "micro-batch at " << start;
  }
}

// labels=targets with Hugging Face's own mean: the golden normalisation on the shifted targets' counts.
// The candidate records the golden count (it counted the targets it was given).
TEST_F(HfSignatures, TargetsShiftedTwiceNormalisedByTheirOwnCounts) {
  for (const GoldenRun* golden : goldens()) {
    SCOPED_TRACE(golden->path);
    StepRecord record = trainer_step(golden->config, golden->init, 1, shifted_twice(golden->batch(1)));
    record.num_loss_tokens = golden->record(1).num_loss_tokens;
    const DiffResult result = analyse(*golden, dump(*golden, record), "shifted_own");
    expect_verdicts(result, {"targets_shifted_twice"});
    EXPECT_NE(message_of(result, "targets_shifted_twice").find("touchstone.loss.micro_batch_loss"),
              std::string::npos);
  }
  // Recording the shifted count as well: the count is named too.
  StepRecord record = trainer_step(masked_->config, masked_->init, 1, shifted_twice(masked_->batch(1)));
  expect_verdicts(analyse(*masked_, dump(*masked_, record), "shifted_own_count"),
                  {"targets_shifted_twice", "token_count"});
}

// labels=targets with the golden counts: num_items_in_batch = the golden count, or the summed loss times
// the golden loss weight (1/N for global_token_mean, 1/(N_j * B/mbs) for per_microbatch_mean). Built
// from the trainer on each shifted micro-batch alone (its objective: the micro-batch's loss sum over its
// own shifted count n_j), reweighted by n_j times the golden weight.
TEST_F(HfSignatures, TargetsShiftedTwiceNormalisedByTheGoldenCounts) {
  for (const GoldenRun* golden : {masked_.get(), per_microbatch_.get()}) {
    SCOPED_TRACE(golden->path);
    const int64_t mbs = golden->config.train.micro_batch_size, B = golden->windows();
    const GlobalBatch& batch = golden->batch(1);
    const GlobalBatch shifted = shifted_twice(batch);
    Config one = golden->config;
    one.train.global_batch_size = mbs;
    StepRecord candidate;
    candidate.step = 1;
    candidate.num_loss_tokens = batch.loss_tokens(0, B);
    candidate.grads = ParamTensors::zeros_like(*golden->table);
    for (int64_t start = 0; start < B; start += mbs) {
      const StepRecord part = trainer_step(one, golden->init, 1, windows_of(shifted, start, mbs));
      const bool global = golden->config.train.loss_normalization == LossNormalization::kGlobalTokenMean;
      const double golden_weight =
          global ? 1.0 / static_cast<double>(candidate.num_loss_tokens)
                 : 1.0 / (static_cast<double>(batch.loss_tokens(start, mbs)) * static_cast<double>(B / mbs));
      const double weight = static_cast<double>(shifted.loss_tokens(start, mbs)) * golden_weight;
      candidate.loss += weight * part.loss;
      for (int id = 0; id < golden->table->size(); ++id) {
        for (size_t i = 0; i < part.grads[id].size(); ++i)
          candidate.grads[id][i] += weight * part.grads[id][i];
      }
      candidate.token_losses.insert(candidate.token_losses.end(), part.token_losses.begin(),
                                    part.token_losses.end());
    }
    double squares = 0;
    for (const auto& g : candidate.grads.tensors) {
      for (double x : g) squares += x * x;
    }
    candidate.grad_norm = std::sqrt(squares);
    expect_verdicts(analyse(*golden, dump(*golden, candidate), "shifted_golden"), {"targets_shifted_twice"});
  }
}

}  // namespace
}  // namespace touchstone::diff::testing
