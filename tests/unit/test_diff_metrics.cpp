// Tests of the diff's per-tensor metrics: the error measures, the elementwise over-tolerance count, the
// worst element's multi-index, ULP distances on the stored type, non-finite candidates, and the order
// in which the diff walks the parameters; and the envelope's error measure that tolerances are made of.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "model/param_table.h"
#include "oracle/diff/diff.h"
#include "oracle/diff/metrics.h"
#include "oracle/golden/golden_writer.h"

namespace touchstone::diff {
namespace {

Recorded tensor(std::vector<int64_t> shape, std::vector<double> values, std::string dtype = "float64") {
  return Recorded{std::move(shape), std::move(values), std::move(dtype)};
}

TEST(DiffMetrics, MeasuresAgainstTheWholeGoldenTensor) {
  const Recorded golden = tensor({2, 3}, {1, -2, 3, -4, 5, 10});
  const Recorded candidate = tensor({2, 3}, {1, -2, 3, -4, 5.5, 10});
  const TensorMetrics m = compare_values(golden, candidate, Tolerance{1e-3, 1e-3});
  EXPECT_DOUBLE_EQ(m.max_abs_error, 0.5);
  EXPECT_DOUBLE_EQ(m.max_abs_golden, 10);
  EXPECT_DOUBLE_EQ(m.max_abs_normalized, 0.05);
  EXPECT_NEAR(m.relative_l2, 0.5 / std::sqrt(1 + 4 + 9 + 16 + 25 + 100), 1e-15);
  EXPECT_EQ(m.worst_index, (std::vector<int64_t>{1, 1}));
  EXPECT_DOUBLE_EQ(m.worst_golden, 5);
  EXPECT_DOUBLE_EQ(m.worst_candidate, 5.5);
  EXPECT_EQ(m.over_tolerance, 1);
  EXPECT_LT(m.cosine, 1.0);
  EXPECT_GT(m.cosine, 0.99);
  EXPECT_FALSE(passes(m, Tolerance{1e-3, 1e-3}));
  EXPECT_TRUE(passes(compare_values(golden, candidate, Tolerance{0.1, 0.1}), Tolerance{0.1, 0.1}));
}

TEST(DiffMetrics, OverToleranceIsNormalisedByTheLargestGoldenMagnitude) {
  // A relative error of 100% on a tiny element is not counted: 1e-6 <= 1e-4 * max|g| = 1e-4.
  const Recorded golden = tensor({3}, {1e-6, 1, -1});
  const Recorded candidate = tensor({3}, {2e-6, 1, -1});
  const TensorMetrics m = compare_values(golden, candidate, Tolerance{1e-4, 1e-4});
  EXPECT_EQ(m.over_tolerance, 0);
  EXPECT_TRUE(passes(m, Tolerance{1e-4, 1e-4}));
}

TEST(DiffMetrics, ZeroGoldenAndScalars) {
  const TensorMetrics zeros = compare_values(tensor({2}, {0, 0}), tensor({2}, {0, 0}), Tolerance{0, 0});
  EXPECT_EQ(zeros.relative_l2, 0);
  EXPECT_EQ(zeros.cosine, 1);
  EXPECT_TRUE(passes(zeros, Tolerance{0, 0}));
  const TensorMetrics off = compare_values(tensor({2}, {0, 0}), tensor({2}, {0, 3}), Tolerance{1, 1});
  EXPECT_DOUBLE_EQ(off.relative_l2, 3);  // ||c - g|| when g is zero
  EXPECT_EQ(off.cosine, 0);
  const TensorMetrics scalar = compare_values(tensor({}, {2}), tensor({}, {2.5}), Tolerance{1, 1});
  EXPECT_TRUE(scalar.worst_index.empty());
  EXPECT_DOUBLE_EQ(scalar.relative_l2, 0.25);
}

TEST(DiffMetrics, NonFiniteCandidateValuesFail) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const TensorMetrics m =
      compare_values(tensor({2, 2}, {1, 2, 3, 4}), tensor({2, 2}, {1, 2, nan, HUGE_VAL}), Tolerance{1, 1});
  EXPECT_EQ(m.non_finite, 2);
  EXPECT_EQ(m.first_non_finite, (std::vector<int64_t>{1, 0}));
  EXPECT_FALSE(passes(m, Tolerance{1, 1}));
}

TEST(DiffMetrics, UlpDistanceOnTheStoredType) {
  const double one = 1.0;
  EXPECT_EQ(ulp_distance(one, std::nextafter(one, 2.0), "float64"), 1u);
  EXPECT_EQ(ulp_distance(one, static_cast<double>(std::nextafter(1.0f, 2.0f)), "float32"), 1u);
  // Across zero: the smallest subnormals on either side are two steps apart.
  const double tiny = std::numeric_limits<double>::denorm_min();
  EXPECT_EQ(ulp_distance(-tiny, tiny, "float64"), 2u);
  EXPECT_EQ(ulp_distance(0.0, -0.0, "float64"), 0u);

  const Recorded g = tensor({2}, {1.0, 2.0}, "float32");
  Recorded c =
      tensor({2}, {1.0, static_cast<double>(std::nextafter(std::nextafter(2.0f, 3.0f), 3.0f))}, "float32");
  EXPECT_EQ(compare_values(g, c, Tolerance{1, 1}).max_ulp, 2u);
  EXPECT_TRUE(compare_values(g, c, Tolerance{1, 1}).has_ulp);
  c.dtype = "bfloat16";  // different stored types: no ULP distance
  EXPECT_FALSE(compare_values(g, c, Tolerance{1, 1}).has_ulp);
}

TEST(DiffMetrics, Unravel) {
  EXPECT_EQ(unravel(7, {2, 3, 2}), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(unravel(0, {}), (std::vector<int64_t>{}));
}

TEST(DiffOrder, BackwardDataFlowOrder) {
  ModelConfig model;
  model.num_layers = 2;
  const ParamTable table(model);
  std::vector<std::string> names;
  for (int id : params_in_flow_order(table)) names.push_back(table[id].name);
  const std::vector<std::string> expected = {
      "output_layer.weight",
      "decoder.final_layernorm.weight",
      "decoder.layers.1.mlp.linear_fc2.weight",
      "decoder.layers.1.mlp.linear_fc1.weight",
      "decoder.layers.1.pre_mlp_layernorm.weight",
      "decoder.layers.1.self_attention.linear_proj.weight",
      "decoder.layers.1.self_attention.linear_qkv.weight",
      "decoder.layers.1.input_layernorm.weight",
      "decoder.layers.0.mlp.linear_fc2.weight",
      "decoder.layers.0.mlp.linear_fc1.weight",
      "decoder.layers.0.pre_mlp_layernorm.weight",
      "decoder.layers.0.self_attention.linear_proj.weight",
      "decoder.layers.0.self_attention.linear_qkv.weight",
      "decoder.layers.0.input_layernorm.weight",
      "embedding.word_embeddings.weight",
  };
  EXPECT_EQ(names, expected);
  model.tie_embeddings = true;
  const ParamTable tied(model);
  EXPECT_EQ(tied[params_in_flow_order(tied).front()].name, "decoder.final_layernorm.weight");
  EXPECT_EQ(params_in_flow_order(tied).size(), expected.size() - 1);
}

// The envelope's largest-element error is one sample; it is taken no smaller than the largest of n errors
// of the measured root-mean-square size spread evenly, rms * sqrt(2 ln n) (docs/precision.md).
TEST(EnvelopeError, LargestElementErrorIsNoSmallerThanTheSpreadOfItsRms) {
  const size_t n = 64;
  const std::vector<double> ref(n, 1.0);
  std::vector<double> even(n);
  for (size_t i = 0; i < n; ++i) even[i] = 1.0 + (i % 2 == 0 ? 1e-3 : -1e-3);  // |error| 1e-3 everywhere
  const std::array<double, 2> spread = envelope_error(even, ref);
  EXPECT_NEAR(spread[0], 1e-3, 1e-15);
  // The measured maximum (1e-3) is below what n errors of rms 1e-3 reach: 1e-3 * sqrt(2 ln 64) = 2.88e-3.
  EXPECT_NEAR(spread[1], 1e-3 * std::sqrt(2.0 * std::log(64.0)), 1e-15);

  std::vector<double> one_element = ref;
  one_element[5] += 8e-3;  // rms 1e-3, max 8e-3: the measured maximum stands
  EXPECT_NEAR(envelope_error(one_element, ref)[1], 8e-3, 1e-15);
}

TEST(EnvelopeError, AScalarKeepsItsOwnError) {
  const std::array<double, 2> error = envelope_error({2.5}, {2.0});
  EXPECT_DOUBLE_EQ(error[0], 0.25);
  EXPECT_DOUBLE_EQ(error[1], 0.25);
}

}  // namespace
}  // namespace touchstone::diff
