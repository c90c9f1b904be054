// The optimizer check's arithmetic (oracle/diff/optimizer_check.h) and the per-element bounds it hands to
// the metrics:
//   - adam_step_bound(t) against a brute-force maximisation of |m_hat / sqrt(v_hat)| over gradient
//     sequences (a grid of signed magnitudes, exhaustively, and random sequences) for t = 1..6, and
//     attained by the Cauchy-Schwarz maximiser g_k ~ (b1/b2)^(t-k), also through adamw_step itself;
//   - expected_update under the contract's rule reproduces optim/optimizer.h's adamw_step on the FP64
//     CPU backend bit for bit over several updates with clipping active, replayed from zero moments or
//     continued from the moments of the update before;
//   - Touchstone's own FP32 AdamW (the CPU backend in FP32) lands inside the bounds of
//     expected_update(FP32) over several updates, with the recorded norm and with a norm the candidate
//     summed in FP32 and did not record, and the worst |candidate - expected| / bound is printed; every
//     mistaken rule lands outside its bounds;
//   - compare_values with ElementBounds: bounded elements are judged by their bound alone and left out
//     of the tensor-wide rule, worst_bound_ratio and tolerance_ratio.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "kernels/backend.h"
#include "model/param_table.h"
#include "optim/optimizer.h"
#include "oracle/diff/metrics.h"
#include "oracle/diff/optimizer_check.h"

namespace touchstone::diff {
namespace {

// A deterministic generator independent of the standard library's distributions (splitmix64).
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  double uniform() {  // [0, 1)
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1p-53;
  }
  double sign() { return uniform() < 0.5 ? -1.0 : 1.0; }
  // sign x 10^U(lo, hi): magnitudes spread over many decades.
  double log_uniform(double lo, double hi) { return sign() * std::pow(10.0, lo + (hi - lo) * uniform()); }

 private:
  uint64_t state_;
};

// |m_hat| / sqrt(v_hat) after the updates of `g` (eps = 0), by Adam's recursion; 0 when v is 0.
double adam_ratio(const OptimConfig& o, const std::vector<double>& g) {
  double m = 0, v = 0;
  for (double x : g) {
    m = o.beta1 * m + (1 - o.beta1) * x;
    v = o.beta2 * v + (1 - o.beta2) * x * x;
  }
  const auto t = static_cast<double>(g.size());
  if (v == 0) return 0.0;
  return std::fabs(m / (1 - std::pow(o.beta1, t))) / std::sqrt(v / (1 - std::pow(o.beta2, t)));
}

std::vector<OptimConfig> beta_pairs() {
  std::vector<OptimConfig> pairs;
  for (const auto& [b1, b2] :
       std::vector<std::pair<double, double>>{{0.9, 0.95}, {0.9, 0.999}, {0.9, 0.6}, {0.5, 0.9}}) {
    OptimConfig o;
    o.beta1 = b1;
    o.beta2 = b2;
    pairs.push_back(o);
  }
  return pairs;
}

TEST(AdamStepBound, NoGradientSequenceExceedsItAndTheCauchySchwarzMaximiserAttainsIt) {
  // Values of each g_k on the grid: signed magnitudes over three octaves and zero (9^6 = 531441
  // sequences at t = 6), then 20000 random sequences with magnitudes over 10 decades, the best of them
  // refined by coordinate ascent. The bound is a maximum, so all must stay below it up to the rounding
  // of the recursion (1e-12 relative is 1e3 x the few ulps of t <= 6 multiply-adds); the maximiser
  // reaches it to the same accuracy, and the ascent to 1e-6 (it stops at steps of 1e-9 relative, and
  // the ratio is flat to second order at its maximum).
  const std::vector<double> grid = {-4, -2, -1, -0.5, 0, 0.5, 1, 2, 4};
  for (const OptimConfig& o : beta_pairs()) {
    for (int64_t t = 1; t <= 6; ++t) {
      const double bound = adam_step_bound(o, t);
      double brute = 0.0;
      std::vector<double> g(static_cast<size_t>(t));
      std::vector<size_t> index(static_cast<size_t>(t), 0);
      for (bool more = true; more;) {
        for (size_t k = 0; k < g.size(); ++k) g[k] = grid[index[k]];
        brute = std::max(brute, adam_ratio(o, g));
        more = false;
        for (size_t k = 0; k < index.size() && !more; ++k) {
          more = ++index[k] < grid.size();
          if (!more) index[k] = 0;
        }
      }
      Random random(static_cast<uint64_t>(t) * 7919 + static_cast<uint64_t>(o.beta2 * 1000));
      std::vector<double> best;
      double best_random = -1.0;
      for (int trial = 0; trial < 20000; ++trial) {
        for (double& x : g) x = random.log_uniform(-5, 5);
        if (adam_ratio(o, g) > best_random) {
          best_random = adam_ratio(o, g);
          best = g;
        }
      }
      brute = std::max(brute, best_random);
      // Coordinate ascent from the best random sequence: each g_k moved by +- step x max |g| while that
      // helps (so signs can change), the step halved when nothing does.
      for (double step = 0.5; step > 1e-10;) {
        double scale = 0.0;
        for (double x : best) scale = std::max(scale, std::fabs(x));
        bool improved = false;
        for (double& x : best) {
          for (const double move : {step * scale, -step * scale}) {
            const double kept = x, before = adam_ratio(o, best);
            x += move;
            if (adam_ratio(o, best) > before) {
              improved = true;
            } else {
              x = kept;
            }
          }
        }
        if (!improved) step /= 2;
      }
      const double climbed = adam_ratio(o, best);
      brute = std::max(brute, climbed);
      for (size_t k = 0; k < g.size(); ++k)
        g[k] = std::pow(o.beta1 / o.beta2, static_cast<double>(t - 1) - static_cast<double>(k));
      const double attained = adam_ratio(o, g);
      std::printf("beta1 %.2f beta2 %.3f t %lld: bound %.9f, brute force %.9f, maximiser %.9f\n", o.beta1,
                  o.beta2, static_cast<long long>(t), bound, brute, attained);
      EXPECT_LE(brute, bound * (1 + 1e-12)) << "t " << t;
      // The search gets within 1e-6 of the bound on its own: the bound is the maximum, not just above it.
      EXPECT_GE(climbed, bound * (1 - 1e-6)) << "t " << t;
      EXPECT_NEAR(attained, bound, bound * 1e-12) << "t " << t;
    }
  }
}

TEST(AdamStepBound, BoundsTheMovementOfAnAdamWStep) {
  // One element through optim/optimizer.h's AdamW (lr 1, no weight decay, FP64): update t moves it by
  // at most adam_step_bound(t), and by the bound (less eps's 1e-8 relative effect) under the maximiser.
  ModelConfig m;
  m.num_layers = 1;
  const ParamTable table(m);
  const auto backend = make_cpu_backend();
  for (OptimConfig o : beta_pairs()) {
    o.weight_decay = 0.0;
    for (int64_t t = 1; t <= 6; ++t) {
      ParamTensors params = ParamTensors::zeros_like(table);
      AdamWState state = AdamWState::zeros_like(params);
      double before = 0.0;
      for (int64_t k = 1; k <= t; ++k) {
        ParamTensors grads = ParamTensors::zeros_like(table);
        grads[table.final_norm()][0] = std::pow(o.beta1 / o.beta2, static_cast<double>(t - k));
        before = params[table.final_norm()][0];
        adamw_step(*backend, table, o, 1.0, 1.0, grads, params, state);
      }
      const double moved = std::fabs(params[table.final_norm()][0] - before);
      EXPECT_LE(moved, adam_step_bound(o, t) * (1 + 1e-12)) << "t " << t;
      EXPECT_GE(moved, adam_step_bound(o, t) * (1 - 1e-7)) << "t " << t;
    }
  }
}

// A small model's table; 2-D parameters with magnitudes spread over 8 decades below 0.3 (where |p| is
// below lr, the rounding of the update, not the parameter's ulp, dominates an element's bound), norm
// weights near 1; gradients spread over 8 decades (2% exactly zero), large enough that clipping to 1
// acts at every update.
ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 32;
  m.hidden_size = 16;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.ffn_hidden_size = 24;
  return m;
}

struct Problem {
  ModelConfig model = small_model();
  ParamTable table{model};
  OptimConfig optim;
  ParamTensors params;
  std::vector<ParamTensors> grads;  // [update - 1]

  explicit Problem(int64_t updates) {
    optim.clip_grad = 1.0;
    optim.warmup_steps = 2;
    optim.decay_steps = 10;  // distinct rates for updates 0..6: no lr mistake coincides with the contract
    Random random(2024);
    params = ParamTensors::zeros_like(table);
    for (int id = 0; id < table.size(); ++id) {
      for (double& p : params[id])
        p = table[id].weight_decay ? 0.3 * random.log_uniform(-8, 0)
                                   : 1 + 0.1 * random.sign() * random.uniform();
    }
    for (int64_t s = 0; s < updates; ++s) {
      ParamTensors g = ParamTensors::zeros_like(table);
      for (auto& tensor : g.tensors) {
        for (double& x : tensor) x = random.uniform() < 0.02 ? 0.0 : random.log_uniform(-8, 0);
      }
      grads.push_back(std::move(g));
    }
  }
};

TEST(ExpectedUpdate, TheContractRuleReproducesTouchstonesFp64AdamWBitForBit) {
  Problem p(5);
  const auto backend = make_cpu_backend();
  ParamTensors params = p.params;
  AdamWState state = AdamWState::zeros_like(params);
  std::vector<const ParamTensors*> replayed;
  std::vector<double> norms;
  for (int64_t s = 1; s <= 5; ++s) {
    const ParamTensors& g = p.grads[static_cast<size_t>(s - 1)];
    const double norm = global_norm(g);
    ASSERT_LT(clip_coefficient(norm, p.optim.clip_grad), 0.5) << "clipping should act";
    const ParamTensors before = params;
    const AdamWState moments_before = state;
    adamw_step(*backend, p.table, p.optim, learning_rate(p.optim, s),
               clip_coefficient(norm, p.optim.clip_grad), g, params, state);
    replayed.push_back(&g);
    norms.push_back(norm);
    // Replayed from zero moments over updates 1..s.
    const ExpectedUpdate replay =
        expected_update(p.table, p.optim, OptimizerInputs{replayed, norms, nullptr, &before}, OptimizerRule{},
                        MasterFormat{});
    EXPECT_EQ(replay.lr, learning_rate(p.optim, s));
    EXPECT_EQ(replay.params.tensors, params.tensors) << "update " << s << " replayed";
    // Continued from the moments after update s - 1.
    const ExpectedUpdate continued =
        expected_update(p.table, p.optim, OptimizerInputs{{&g}, {norm}, &moments_before, &before},
                        OptimizerRule{}, MasterFormat{});
    EXPECT_EQ(continued.params.tensors, params.tensors) << "update " << s << " continued";
  }
}

// The FP32 sum of squares, as a candidate computing its norm in float would.
double fp32_norm(const ParamTensors& grads) {
  float sum = 0.0f;
  for (const auto& t : grads.tensors) {
    for (double g : t) sum += static_cast<float>(g) * static_cast<float>(g);
  }
  return static_cast<double>(std::sqrt(sum));
}

// Largest |candidate - expected| / bound over every element (infinite where a bound is 0 and exceeded).
double worst_ratio(const ParamTensors& candidate, const ExpectedUpdate& expected) {
  double worst = 0.0;
  for (size_t t = 0; t < candidate.tensors.size(); ++t) {
    for (size_t i = 0; i < candidate.tensors[t].size(); ++i) {
      const double error = std::fabs(candidate.tensors[t][i] - expected.params.tensors[t][i]);
      const double bound = expected.bounds.tensors[t][i];
      worst = std::max(worst, bound > 0 ? error / bound : (error > 0 ? HUGE_VAL : 0.0));
    }
  }
  return worst;
}

TEST(ExpectedUpdate, TouchstonesFp32AdamWLandsInsideTheFp32BoundsAndEveryMistakeOutside) {
  // The candidate: Touchstone's AdamW on the FP32 CPU backend (FP32 master weights and moments), fed
  // FP32 gradients. The check replays it in FP64 from the candidate's parameters after update s - 1 and
  // all its gradients; the bounds must hold as derived (docs/precision.md), not loosened here.
  constexpr int64_t kUpdates = 6;
  for (const bool recorded_norm : {true, false}) {
    SCOPED_TRACE(recorded_norm ? "norm recorded" : "norm summed in FP32, not recorded");
    Problem p(kUpdates);
    const auto backend = make_cpu_backend(BackendOptions{Precision::kFp32, true});
    ParamTensors params = p.params;
    for (auto& t : params.tensors)
      backend->round(TensorRole::kState, t.data(), static_cast<int64_t>(t.size()));
    for (auto& g : p.grads) {
      for (auto& t : g.tensors) backend->round(TensorRole::kState, t.data(), static_cast<int64_t>(t.size()));
    }
    AdamWState state = AdamWState::zeros_like(params);
    std::vector<const ParamTensors*> replayed;
    std::vector<double> norms;
    double worst = 0.0;
    for (int64_t s = 1; s <= kUpdates; ++s) {
      const ParamTensors& g = p.grads[static_cast<size_t>(s - 1)];
      const double norm = recorded_norm ? global_norm(g) : fp32_norm(g);
      const ParamTensors before = params;
      adamw_step(*backend, p.table, p.optim, learning_rate(p.optim, s),
                 clip_coefficient(norm, p.optim.clip_grad), g, params, state);
      replayed.push_back(&g);
      norms.push_back(recorded_norm ? norm : std::numeric_limits<double>::quiet_NaN());
      const OptimizerInputs inputs{replayed, norms, nullptr, &before};
      const ExpectedUpdate expected =
          expected_update(p.table, p.optim, inputs, OptimizerRule{}, master_format(Precision::kFp32));
      const double ratio = worst_ratio(params, expected);
      worst = std::max(worst, ratio);
      EXPECT_LE(ratio, 1.0) << "update " << s;
      // The same through the metrics, as the judge applies it (every element on its own bound).
      for (int id = 0; id < p.table.size(); ++id) {
        const Recorded reference{p.table[id].shape, expected.params[id], "float64"};
        const Recorded candidate{p.table[id].shape, params[id], "float32"};
        EXPECT_TRUE(passes(compare_values(reference, candidate, Tolerance{0, 0}, &expected.bounds[id]),
                           Tolerance{0, 0}))
            << "update " << s << ", " << p.table[id].name;
      }
      for (const OptimizerRule& rule : mistaken_optimizer_rules()) {
        const ExpectedUpdate mistaken =
            expected_update(p.table, p.optim, inputs, rule, master_format(Precision::kFp32));
        EXPECT_GT(worst_ratio(params, mistaken), 1.0) << rule.signature << " at update " << s;
      }
    }
    std::printf("FP32 AdamW against expected_update(fp32), %s: worst |candidate - expected| / bound = %.3g\n",
                recorded_norm ? "recorded norm" : "unrecorded FP32 norm", worst);
  }
}

Recorded values(std::vector<double> v) {
  const auto n = static_cast<int64_t>(v.size());
  return Recorded{{n}, std::move(v), "float64"};
}

TEST(ElementBounds, BoundedElementsAreJudgedByTheirBoundAloneAndLeftOutOfTheTensorRule) {
  const Tolerance tol{1e-3, 1e-3};
  const Recorded golden = values({1, 2, 100, -4});
  const Recorded candidate = values({1, 2, 150, -4});  // element 2 off by 50
  // Without a bound the tensor fails: relative L2 0.5, 500 x its tolerance.
  const TensorMetrics plain = compare_values(golden, candidate, tol);
  EXPECT_FALSE(passes(plain, tol));
  EXPECT_EQ(plain.bounded, 0);
  EXPECT_DOUBLE_EQ(plain.rule_relative_l2, plain.relative_l2);
  // A bound of 60 on element 2: it passes (50 <= 60), and the rule sees only the exact elements.
  const ElementBounds bounds = {kNoElementBound, kNoElementBound, 60.0, kNoElementBound};
  const TensorMetrics bounded = compare_values(golden, candidate, tol, &bounds);
  EXPECT_TRUE(passes(bounded, tol));
  EXPECT_EQ(bounded.bounded, 1);
  EXPECT_EQ(bounded.over_tolerance, 0);
  EXPECT_EQ(bounded.rule_relative_l2, 0.0);
  EXPECT_EQ(bounded.rule_max_abs_normalized, 0.0);
  EXPECT_DOUBLE_EQ(bounded.worst_bound_ratio, 50.0 / 60.0);
  EXPECT_DOUBLE_EQ(bounded.tolerance_ratio, 50.0 / 60.0);
  // The whole-tensor metrics are still reported as measured.
  EXPECT_DOUBLE_EQ(bounded.relative_l2, plain.relative_l2);
  EXPECT_DOUBLE_EQ(bounded.max_abs_error, 50.0);
  // A bound of 40: that element fails on its own, counted once.
  const ElementBounds tight = {kNoElementBound, kNoElementBound, 40.0, kNoElementBound};
  const TensorMetrics over = compare_values(golden, candidate, tol, &tight);
  EXPECT_FALSE(passes(over, tol));
  EXPECT_EQ(over.over_tolerance, 1);
  EXPECT_DOUBLE_EQ(over.worst_bound_ratio, 1.25);
  EXPECT_DOUBLE_EQ(over.tolerance_ratio, 1.25);
}

TEST(ElementBounds, UnboundedElementsKeepTheTensorRule) {
  // Element 0 off by 0.01 without a bound: relative L2 over the unbounded elements {1.01, 2, -4} vs
  // {1, 2, -4} is 0.01 / sqrt(21) = 2.2e-3 > 1e-3; max-abs 0.01 / max|g| (100, the whole tensor's) = 1e-4.
  const Tolerance tol{1e-3, 1e-3};
  const Recorded golden = values({1, 2, 100, -4});
  const Recorded candidate = values({1.01, 2, 100, -4});
  const ElementBounds bounds = {kNoElementBound, kNoElementBound, 60.0, kNoElementBound};
  const TensorMetrics m = compare_values(golden, candidate, tol, &bounds);
  EXPECT_NEAR(m.rule_relative_l2, 0.01 / std::sqrt(21.0), 1e-15);
  EXPECT_NEAR(m.rule_max_abs_normalized, 1e-4, 1e-15);
  EXPECT_EQ(m.worst_bound_ratio, 0.0);
  EXPECT_NEAR(m.tolerance_ratio, 0.01 / std::sqrt(21.0) / 1e-3, 1e-9);
  EXPECT_FALSE(passes(m, tol));
  // Every element bounded (the optimizer check's case): the tensor rule judges nothing, so even a zero
  // tolerance passes within the bounds, and a zero bound admits only an exact element.
  const ElementBounds all = {0.02, 0.0, 0.0, 0.0};
  const TensorMetrics judged = compare_values(golden, candidate, Tolerance{0, 0}, &all);
  EXPECT_TRUE(passes(judged, Tolerance{0, 0}));
  EXPECT_DOUBLE_EQ(judged.tolerance_ratio, 0.5);
  const ElementBounds zero = {0.0, 0.0, 0.0, 0.0};
  const TensorMetrics exact = compare_values(golden, candidate, Tolerance{0, 0}, &zero);
  EXPECT_FALSE(passes(exact, Tolerance{0, 0}));
  EXPECT_EQ(exact.worst_bound_ratio, HUGE_VAL);
}

}  // namespace
}  // namespace touchstone::diff
