// The counter-based RNG and the initial weights drawn from it: Philox4x32-10 against Random123's
// known answers, normals whose moments are right and which depend only on their coordinates (not on
// the order of drawing), and init following the rule of each parameter-table entry.
#include <gtest/gtest.h>

#include <cmath>

#include "common/rng.h"
#include "model/param_table.h"
#include "model/params.h"

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

}  // namespace
}  // namespace touchstone
