// The optimizer formulas of docs/contract.md "Update" evaluated by hand: the learning-rate schedule
// (warm-up, cosine, floor), the clip coefficient, and two AdamW updates with weight decay on matrices
// only.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "kernels/backend.h"
#include "model/param_table.h"
#include "optim/optimizer.h"

namespace touchstone {
namespace {

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
