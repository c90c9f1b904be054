// The counter-based RNG (known answers, independence from draw order) and the optimizer formulas of
// docs/contract.md "Update" evaluated by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "common/rng.h"
#include "kernels/backend.h"
#include "model/param_table.h"
#include "model/params.h"
#include "optim/optimizer.h"

namespace touchstone {
namespace {

TEST(Philox, MatchesRandom123KnownAnswers) {
  // Random123 tests/kat_vectors, "philox4x32 10": counter, key -> output.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, NormalsHaveTheRightMomentsAndDependOnlyOnCoordinates) {
  const PhiloxKey key = stream_key(1234, "decoder.layers.0.mlp.linear_fc1.weight");
  constexpr int kCount = 200000;
  double sum = 0.0, sum_squares = 0.0;
  for (int i = 0; i < kCount; ++i) {
    const double z = normal_at(key, static_cast<uint64_t>(i));
    sum += z;
    sum_squares += z * z;
  }
  // Standard errors: mean 1/sqrt(n) = 2.2e-3, variance sqrt(2/n) = 3.2e-3; allow 5 of them.
  EXPECT_NEAR(sum / kCount, 0.0, 0.012);
  EXPECT_NEAR(sum_squares / kCount, 1.0, 0.016);
  // Drawing element 99999 alone gives the same number as drawing it in sequence.
  EXPECT_EQ(normal_at(key, 99999),
            normal_at(stream_key(1234, "decoder.layers.0.mlp.linear_fc1.weight"), 99999));
  EXPECT_NE(stream_key(1234, "a"), stream_key(1235, "a"));
  EXPECT_NE(stream_key(1234, "a"), stream_key(1234, "b"));
}

TEST(Init, FollowsTheRulesOfTheTable) {
  ModelConfig model;
  model.num_layers = 8;
  model.init_std = 0.05;
  const ParamTable table(model);
  const ParamTensors params = init_parameters(table, model, 42);
  for (int id = 0; id < table.size(); ++id) {
    const std::vector<double>& values = params[id];
    double sum_squares = 0.0;
    for (double v : values) sum_squares += v * v;
    const double rms = std::sqrt(sum_squares / static_cast<double>(values.size()));
    switch (table[id].init) {
      case InitRule::kOnes:
        for (double v : values) ASSERT_EQ(v, 1.0) << table[id].name;
        break;
      case InitRule::kNormal:
        EXPECT_NEAR(rms, 0.05, 0.05 * 0.1) << table[id].name;
        break;
      case InitRule::kScaledNormal:
        EXPECT_NEAR(rms, 0.05 / 4.0, 0.05 / 4.0 * 0.1) << table[id].name;  // 1 / sqrt(2 * 8) = 1/4
        break;
    }
  }
  EXPECT_EQ(init_parameters(table, model, 42).tensors, params.tensors);
  EXPECT_NE(init_parameters(table, model, 43).tensors, params.tensors);
}

TEST(LearningRate, WarmupThenCosineThenFloor) {
  OptimConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  o.decay_steps = 8;
  EXPECT_DOUBLE_EQ(learning_rate(o, 1), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 6), 0.1 + 0.5 * 0.9 * (1.0 + std::cos(std::numbers::pi * 0.5)));
  EXPECT_DOUBLE_EQ(learning_rate(o, 8), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(o, 100), 0.1);
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate(o, 1), 0.1 + 0.5 * 0.9 * (1.0 + std::cos(std::numbers::pi / 8.0)));
}

TEST(Clipping, ScalesOnlyAboveTheThreshold) {
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(1e9, 0.0), 1.0);  // clipping off
}

TEST(AdamW, TwoUpdatesByHandWithDecayOnlyOnMatrices) {
  ModelConfig model;
  model.vocab_size = 3;
  model.hidden_size = 2;
  model.num_layers = 1;
  model.num_heads = 1;
  model.num_kv_heads = 1;
  model.ffn_hidden_size = 1;
  const ParamTable table(model);
  OptimConfig o;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  ParamTensors params = ParamTensors::zeros_like(table), grads = ParamTensors::zeros_like(table);
  params.fill(0.5);
  grads.fill(0.2);
  AdamWState state = AdamWState::zeros_like(params);
  auto backend = make_cpu_backend();
  adamw_step(*backend, table, o, 0.01, 0.5, grads, params, state);  // grads scaled to 0.1
  adamw_step(*backend, table, o, 0.02, 1.0, grads, params, state);  // grads 0.2

  auto expected = [&](bool decay) {
    double p = 0.5, m = 0.0, v = 0.0;
    const double lrs[] = {0.01, 0.02}, gs[] = {0.1, 0.2};
    for (int s = 1; s <= 2; ++s) {
      m = 0.9 * m + 0.1 * gs[s - 1];
      v = 0.95 * v + 0.05 * gs[s - 1] * gs[s - 1];
      p *= 1.0 - lrs[s - 1] * (decay ? 0.1 : 0.0);
      p -= lrs[s - 1] * (m / (1 - std::pow(0.9, s))) / (std::sqrt(v / (1 - std::pow(0.95, s))) + 1e-8);
    }
    return p;
  };
  for (int id = 0; id < table.size(); ++id) {
    const bool decay = table[id].shape.size() >= 2;
    EXPECT_EQ(table[id].weight_decay, decay);
    for (double p : params[id]) EXPECT_NEAR(p, expected(decay), 1e-15) << table[id].name;
  }
  EXPECT_EQ(state.step, 2);
}

}  // namespace
}  // namespace touchstone
