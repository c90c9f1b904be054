// The optimizer formulas of docs/contract.md "Update" evaluated by hand: the learning-rate schedule
// (warm-up, cosine, floor) in both conventions, the megatron one against a transcription of
// Megatron-LM's scheduler, the clip coefficient, and two AdamW updates with weight decay on matrices
// only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/backend.h"
#include "model/param_table.h"
#include "optim/optimizer.h"

namespace touchstone {
namespace {

// lr 1 to min_lr 0.1: warm-up over updates 1..4, cosine until update 8.
OptimConfig warmup_4_decay_8() {
  OptimConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  o.decay_steps = 8;
  return o;
}

TEST(LearningRate, WarmupThenCosineThenFloor) {
  OptimConfig o = warmup_4_decay_8();
  EXPECT_DOUBLE_EQ(learning_rate(o, 1), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 6), 0.1 + 0.5 * 0.9 * (1.0 + std::cos(std::numbers::pi * 0.5)));
  EXPECT_DOUBLE_EQ(learning_rate(o, 8), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(o, 100), 0.1);
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate(o, 1), 0.1 + 0.5 * 0.9 * (1.0 + std::cos(std::numbers::pi / 8.0)));
}

TEST(LearningRate, WarmupStartsFromWarmupInit) {
  OptimConfig o = warmup_4_decay_8();
  const double default_rate = learning_rate(o, 1);
  o.warmup_init = 0.0;
  EXPECT_EQ(learning_rate(o, 1), default_rate);  // 0 + (lr - 0) s / W: the same bits as lr s / W
  o.warmup_init = 0.2;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 0.2);
  EXPECT_DOUBLE_EQ(learning_rate(o, 2), 0.2 + 0.8 * 2 / 4);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4), 1.0);
  o.warmup_init = 0.0;
  o.warmup_steps = 0;
  EXPECT_EQ(learning_rate(o, 0), 1.0);  // "one step behind" update 1 without warm-up: the cosine's start
}

// Megatron-LM's OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py, main of
// 2026-08, decay style cosine, no WSD), transcribed as the object it is: state num_steps counted in
// samples, step(increment) after every optimizer.step() (megatron/training/training.py train_step:
// increment = micro-batches x micro-batch size x data-parallel size = the global batch), and the
// constructor's step(0). Warm-up and decay lengths are --lr-warmup-iters and --lr-decay-iters times
// the global batch (get_optimizer_param_scheduler).
class MegatronScheduler {
 public:
  MegatronScheduler(double init_lr, double max_lr, double min_lr, int64_t warmup_iters, int64_t decay_iters,
                    int64_t global_batch)
      : init_lr_(init_lr),
        max_lr_(max_lr),
        min_lr_(min_lr),
        warmup_steps_(warmup_iters * global_batch),
        decay_steps_(decay_iters * global_batch) {
    step(0);
  }
  void step(int64_t increment) {
    num_steps_ += increment;
    lr_ = get_lr();
  }
  double lr() const { return lr_; }

 private:
  double get_lr() const {
    if (warmup_steps_ > 0 && num_steps_ <= warmup_steps_) {
      return init_lr_ +
             ((max_lr_ - init_lr_) * static_cast<double>(num_steps_) / static_cast<double>(warmup_steps_));
    }
    if (num_steps_ > decay_steps_) return min_lr_;
    const double decay_ratio =
        static_cast<double>(num_steps_ - warmup_steps_) / static_cast<double>(decay_steps_ - warmup_steps_);
    const double delta_lr = max_lr_ - min_lr_;
    const double coeff = 0.5 * (std::cos(std::numbers::pi * decay_ratio) + 1.0);
    return min_lr_ + coeff * delta_lr;
  }
  double init_lr_, max_lr_, min_lr_;
  int64_t warmup_steps_, decay_steps_;
  int64_t num_steps_ = 0;
  double lr_ = 0.0;
};

// The rates of updates 1..updates a Megatron-LM run uses: each optimizer.step() at the scheduler's
// current rate, then scheduler.step(global batch).
std::vector<double> megatron_rates(double init_lr, double max_lr, double min_lr, int64_t warmup_iters,
                                   int64_t decay_iters, int64_t global_batch, int64_t updates) {
  MegatronScheduler scheduler(init_lr, max_lr, min_lr, warmup_iters, decay_iters, global_batch);
  std::vector<double> rates;
  for (int64_t k = 1; k <= updates; ++k) {
    rates.push_back(scheduler.lr());
    scheduler.step(global_batch);
  }
  return rates;
}

// Megatron divides sample counts (n g) / (W g) where Touchstone divides n / W: in the decay the two
// quotients are the correctly rounded values of one real number, so they and everything after them
// are bitwise equal; in the warm-up (lr - i) n g / (W g) and (lr - i) n / W each round twice (product,
// quotient), so they differ by at most 4 u of the term, plus one rounding of the sum with i:
// 6 u lr bounds it (u = 2^-53). With a global batch of 1 the operations are the same: bitwise equal.
TEST(LearningRate, MegatronConventionIsMegatronsSchedulerStepAfterTheUpdate) {
  const double u = 0x1p-53;
  struct Schedule {
    int64_t warmup, decay;
    double init;
  };
  for (const Schedule sc :
       {Schedule{0, 1, 0.0}, Schedule{1, 2, 0.0}, Schedule{1, 4, 0.0}, Schedule{3, 10, 0.0},
        Schedule{2, 3, 1e-4}, Schedule{7, 30, 3e-5}, Schedule{0, 12, 0.0}}) {
    for (const int64_t global_batch : {1, 3, 8, 24, 1000}) {
      OptimConfig o;
      o.schedule_convention = ScheduleConvention::kMegatron;
      o.lr = 3e-4;
      o.min_lr = 3e-5;
      o.warmup_steps = sc.warmup;
      o.decay_steps = sc.decay;
      o.warmup_init = sc.init;
      const int64_t updates = sc.decay + 5;  // warm-up, decay and the constant tail
      const std::vector<double> expected =
          megatron_rates(sc.init, o.lr, o.min_lr, sc.warmup, sc.decay, global_batch, updates);
      for (int64_t k = 1; k <= updates; ++k) {
        SCOPED_TRACE("W " + std::to_string(sc.warmup) + ", D " + std::to_string(sc.decay) +
                     ", global batch " + std::to_string(global_batch) + ", update " + std::to_string(k));
        const double megatron = expected[static_cast<size_t>(k - 1)];
        const bool warmup = sc.warmup > 0 && k - 1 <= sc.warmup;
        if (!warmup || global_batch == 1) {
          EXPECT_EQ(learning_rate(o, k), megatron);
        } else {
          EXPECT_LE(std::fabs(learning_rate(o, k) - megatron), 6 * u * o.lr);
        }
      }
      EXPECT_EQ(learning_rate(o, 1),
                sc.warmup > 0 ? sc.init : o.lr);  // update 1: the scheduler after step(0)
      EXPECT_EQ(learning_rate(o, sc.decay + 2), o.min_lr);
    }
  }
}

// The megatron convention is the touchstone one a step late, for the same W, D and i: what a Megatron
// run with the obvious flags does against a touchstone golden file (the verdict learning_rate_behind).
TEST(LearningRate, MegatronConventionIsTouchstoneOneStepBehind) {
  for (const int64_t warmup : {0, 1, 3}) {
    OptimConfig touchstone;
    touchstone.warmup_steps = warmup;
    touchstone.decay_steps = 9;
    OptimConfig megatron = touchstone;
    megatron.schedule_convention = ScheduleConvention::kMegatron;
    for (int64_t k = 1; k <= 12; ++k) {
      EXPECT_EQ(learning_rate(megatron, k),
                k == 1 && warmup == 0 ? touchstone.lr : learning_rate(touchstone, k - 1))
          << "W " << warmup << ", update " << k;
    }
  }
}

// The reverse mapping (docs/frameworks/megatron.md): a Megatron-LM run reproduces the touchstone
// convention with --lr-warmup-init lr/W --lr-warmup-iters W-1 --lr-decay-iters D-1, for 1 <= W < D.
// Bound: i + (lr - i) n / (W - 1) against lr s / W, each a few roundings of the same real number:
// 8 u lr (u = 2^-53) covers the warm-up's four roundings on each side; the cosine's argument
// (s - W) / (D - W) is the same quotient, but its operands' order differs, hence the same bound.
TEST(LearningRate, MegatronFlagsThatReproduceTheTouchstoneConvention) {
  const double u = 0x1p-53;
  for (const auto& [warmup, decay] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {1, 4}, {2, 5}, {4, 20}}) {
    OptimConfig o;
    o.lr = 3e-4;
    o.min_lr = 3e-5;
    o.warmup_steps = warmup;
    o.decay_steps = decay;
    const std::vector<double> megatron = megatron_rates(o.lr / static_cast<double>(warmup), o.lr, o.min_lr,
                                                        warmup - 1, decay - 1, 8, decay + 4);
    for (int64_t k = 1; k <= decay + 4; ++k) {
      EXPECT_LE(std::fabs(megatron[static_cast<size_t>(k - 1)] - learning_rate(o, k)), 8 * u * o.lr)
          << "W " << warmup << ", D " << decay << ", update " << k;
    }
  }
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

// AdamW runs on pieces of kAdamWPiece elements: elementwise, so the pieces give the bits of one call on
// the whole tensor, and moments formed in zeroed scratch (not kept) give the bits of held zero moments.
TEST(AdamW, PiecesAndUnkeptMomentsGiveTheBitsOfOneWholeUpdate) {
  ModelConfig model;
  model.vocab_size = 4099;  // the embedding: 4099 x 300 = 1.23 pieces, the last one partial
  model.hidden_size = 300;
  model.num_layers = 1;
  model.num_heads = 3;
  model.num_kv_heads = 1;
  model.ffn_hidden_size = 8;
  const ParamTable table(model);
  ASSERT_GT(static_cast<int64_t>(table[table.embedding()].numel()), kAdamWPiece);
  OptimConfig o;
  o.weight_decay = 0.1;
  ParamTensors start = ParamTensors::zeros_like(table), grads = ParamTensors::zeros_like(table);
  for (auto& t : start.tensors)
    for (size_t i = 0; i < t.size(); ++i) t[i] = std::sin(0.37 * static_cast<double>(i) + 0.1);
  for (auto& t : grads.tensors)
    for (size_t i = 0; i < t.size(); ++i) t[i] = std::cos(0.11 * static_cast<double>(i)) * 1e-3;
  auto backend = make_cpu_backend();
  const double lr = 0.01, scale = 0.7;

  ParamTensors whole = start;  // one Backend::adamw_update per tensor, as before the pieces
  for (int id = 0; id < table.size(); ++id) {
    std::vector<double> scaled = grads[id], m(scaled.size(), 0.0), v(scaled.size(), 0.0);
    for (double& g : scaled) g *= scale;
    const AdamWStep step{lr, o.beta1, o.beta2, o.eps, table[id].weight_decay ? o.weight_decay : 0.0, 1};
    backend->adamw_update(whole[id].data(), scaled.data(), m.data(), v.data(),
                          static_cast<int64_t>(scaled.size()), step);
  }
  ParamTensors kept = start, unkept = start;
  AdamWState held = AdamWState::zeros_like(start), none;
  adamw_step(*backend, table, o, lr, scale, grads, kept, held);
  adamw_step(*backend, table, o, lr, scale, grads, unkept, none);
  for (int id = 0; id < table.size(); ++id) {
    EXPECT_EQ(kept[id], whole[id]) << table[id].name;
    EXPECT_EQ(unkept[id], whole[id]) << table[id].name;
  }
  EXPECT_EQ(held.step, 1);
  EXPECT_EQ(none.step, 1);
  EXPECT_TRUE(none.exp_avg.tensors.empty()) << "unkept moments were allocated";
  // The held moments are the first update's: (1 - beta1) g and (1 - beta2) g^2 of the scaled gradient.
  const int e = table.embedding();
  const double g = grads[e].back() * scale;
  EXPECT_DOUBLE_EQ(held.exp_avg[e].back(), (1 - o.beta1) * g);
  EXPECT_DOUBLE_EQ(held.exp_avg_sq[e].back(), (1 - o.beta2) * g * g);
}

}  // namespace
}  // namespace touchstone
