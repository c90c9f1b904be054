// The activation arena (common/activation_arena.h): the greedy-by-size layout never overlaps two buffers
// alive at once, a repeated step takes every buffer from the block, a step that differs is served from
// the heap without touching live data, and training steps give the same bits when every new buffer is
// poisoned with NaN (so no kernel reads an element of a buffer it has not written).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/activation_arena.h"
#include "kernels/backend.h"
#include "oracle/run.h"
#include "oracle/train_step.h"
#include "parallel/comm/context.h"

namespace touchstone {
namespace {

bool overlaps_in_time(const ArenaLifetime& a, const ArenaLifetime& b) {
  return a.allocated < b.released && b.allocated < a.released;
}

TEST(ArenaLayout, BuffersAliveAtOnceNeverShareBytes) {
  // Random lifetimes: sizes 1..64 cache lines, 200 buffers over an event sequence.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::vector<ArenaLifetime> lifetimes;
    uint64_t state = seed * 0x9E3779B97F4A7C15ull;
    const auto next = [&](uint64_t n) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<int64_t>((state >> 33) % n);
    };
    int64_t event = 0;
    for (int i = 0; i < 200; ++i) {
      const int64_t start = event++;
      lifetimes.push_back({64 * (1 + next(64)), start, start + 1 + next(40)});
    }
    const ArenaLayout layout = plan_arena_layout(lifetimes);
    int64_t peak_live = 0;
    for (int64_t t = 0; t < event + 40; ++t) {
      int64_t live = 0;
      for (const ArenaLifetime& b : lifetimes) live += (b.allocated <= t && t < b.released) ? b.bytes : 0;
      peak_live = std::max(peak_live, live);
    }
    for (size_t i = 0; i < lifetimes.size(); ++i) {
      const int64_t oi = layout.offsets[i];
      ASSERT_GE(oi, 0);
      ASSERT_LE(oi + lifetimes[i].bytes, layout.bytes);
      for (size_t j = i + 1; j < lifetimes.size(); ++j) {
        if (!overlaps_in_time(lifetimes[i], lifetimes[j])) continue;
        const int64_t oj = layout.offsets[j];
        EXPECT_TRUE(oi + lifetimes[i].bytes <= oj || oj + lifetimes[j].bytes <= oi)
            << "seed " << seed << ": buffers " << i << " and " << j << " share bytes";
      }
    }
    EXPECT_GE(layout.bytes, peak_live);  // no layout can be smaller than what is live at once
  }
}

TEST(ArenaLayout, NeverReleasedBuffersAreLeftOut) {
  const ArenaLayout layout = plan_arena_layout({{128, 0, 2}, {256, 1, ArenaLifetime::kNever}});
  EXPECT_EQ(layout.offsets[1], -1);
  EXPECT_EQ(layout.bytes, 128);
}

// One "step": buffers of the given element counts, each freed after the next is made (a chain, like the
// passes' temporaries), the last one at the end.
void chain_step(ActivationArena& arena, const std::vector<int64_t>& sizes, std::vector<double*>* seen) {
  const ActivationArena::Step step(&arena);
  ActivationBuffer previous;
  for (int64_t n : sizes) {
    ActivationBuffer b(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) b[static_cast<size_t>(i)] = static_cast<double>(i);
    if (seen) seen->push_back(b.data());
    previous = std::move(b);
  }
}

TEST(ActivationArena, ARepeatedStepTakesEveryBufferFromTheBlock) {
  ActivationArena arena;
  const std::vector<int64_t> sizes{1000, 20, 5000, 1000, 7};
  chain_step(arena, sizes, nullptr);  // recorded, then laid out
  EXPECT_EQ(arena.stats().plans, 1);
  EXPECT_GT(arena.stats().block_bytes, 0);
  std::vector<double*> second, third;
  chain_step(arena, sizes, &second);
  chain_step(arena, sizes, &third);
  EXPECT_EQ(arena.stats().heap, 0);
  EXPECT_EQ(arena.stats().planned, 2 * static_cast<int64_t>(sizes.size()));
  EXPECT_EQ(second, third) << "the same buffer index gets the same place every step";
  EXPECT_EQ(arena.stats().plans, 1);
}

TEST(ActivationArena, AStepThatDiffersIsServedFromTheHeapAndPlannedAgain) {
  ActivationArena arena;
  chain_step(arena, {1000, 1000}, nullptr);
  {
    // Buffer 1 asks for another size, and buffer 0 is still alive when the plan would reuse its place.
    const ActivationArena::Step step(&arena);
    ActivationBuffer a(1000), b(3000);
    std::fill(a.begin(), a.end(), 1.0);
    std::fill(b.begin(), b.end(), 2.0);
    for (double x : a) ASSERT_EQ(x, 1.0) << "a heap buffer was placed over a live one";
  }
  EXPECT_EQ(arena.stats().heap, 1);
  EXPECT_EQ(arena.stats().plans, 2);  // the differing step was laid out
  chain_step(arena, {1000, 3000}, nullptr);
  EXPECT_EQ(arena.stats().heap, 1);
}

TEST(ActivationArena, BuffersOutsideAStepComeFromTheHeap) {
  ActivationArena arena;
  ActivationBuffer outside(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(outside.data()) % ActivationArena::kAlignment, 0u);
  EXPECT_EQ(arena.stats().planned + arena.stats().heap, 0);
}

TEST(ActivationArena, PoisonFillsNewBuffersWithNan) {
  ActivationArena::set_poison(true);
  ActivationBuffer b(16);
  ActivationArena::set_poison(false);
  for (double x : b) EXPECT_TRUE(std::isnan(x));
}

// Three steps of the default config with dropout on, once plain and once with every new buffer NaN:
// the arena hands the second and third steps memory that held the first step's values, so a kernel
// that read before writing would change the results; NaN makes any such read visible.
std::vector<ParamTensors> three_steps(bool poison) {
  Config config;
  config.train.steps = 3;
  config.model.attention_dropout = 0.1;
  config.model.hidden_dropout = 0.1;
  const PreparedRun run = prepare_run(config, RunOptions{});
  auto backend = make_cpu_backend();
  SingleProcessContext single;
  ActivationArena::set_poison(poison);
  Trainer trainer(config, run.initial_params, *backend, single.context());
  std::vector<ParamTensors> out;
  for (const GlobalBatch& batch : run.batches) {
    const StepRecord record = trainer.step(batch);
    out.push_back(record.grads);
  }
  out.push_back(trainer.params());
  ActivationArena::set_poison(false);
  EXPECT_EQ(trainer.arena().stats().heap, 0);
  EXPECT_EQ(trainer.arena().stats().plans, 1);
  return out;
}

TEST(ActivationArena, PoisonedBuffersGiveTheSameTrainingBits) {
  const std::vector<ParamTensors> plain = three_steps(false), poisoned = three_steps(true);
  ASSERT_EQ(plain.size(), poisoned.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_EQ(plain[i].tensors.size(), poisoned[i].tensors.size());
    for (size_t t = 0; t < plain[i].tensors.size(); ++t) {
      ASSERT_EQ(plain[i].tensors[t], poisoned[i].tensors[t]) << "output " << i << ", tensor " << t;
    }
  }
}

}  // namespace
}  // namespace touchstone
