// 16-bit parameter copies (oracle/diff/stored_copy.h): round_to_fp16 against known values and the
// compiler's _Float16; the widened tolerance and bounds against their formulas and against the worst
// case they bound; ULPs of bfloat16 and float16; and, through run_analysis, a BF16 copy of the golden
// parameters passing exactly, a wrong update failing, a mistaken learning rate still named, and the
// stored_dtype attribute checked when it is read.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "kernels/precision.h"
#include "oracle/diff/stored_copy.h"
#include "test_diff_signature_fixture.h"

namespace touchstone::diff::testing {
namespace {

TEST(RoundToFp16, KnownValues) {
  EXPECT_EQ(round_to_fp16(1.0), 1.0);
  EXPECT_EQ(round_to_fp16(1 + 0x1p-11), 1.0);                    // tie: to the even 1
  EXPECT_EQ(round_to_fp16(1 + 3 * 0x1p-11), 1 + 0x1p-9);         // tie: to the even 1 + 2^-9
  EXPECT_EQ(round_to_fp16(1 + 0x1p-11 + 0x1p-30), 1 + 0x1p-10);  // above the tie: up
  // One rounding from double: through FP32 the 2^-30 would be lost first and the tie go to 1.
  EXPECT_EQ(round_to_fp16(static_cast<double>(static_cast<float>(1 + 0x1p-11 + 0x1p-30))), 1.0);
  EXPECT_EQ(round_to_fp16(-2.5), -2.5);
  EXPECT_EQ(round_to_fp16(0.1), 0x1.998p-4);  // 0.0999755859375
  // The largest value, the overflow threshold (the midpoint to 2^16 ties to the even 2^16) and beyond.
  EXPECT_EQ(round_to_fp16(65504.0), 65504.0);
  EXPECT_EQ(round_to_fp16(65519.99), 65504.0);
  EXPECT_EQ(round_to_fp16(65520.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(round_to_fp16(-1e300), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(round_to_fp16(std::numeric_limits<double>::infinity()), std::numeric_limits<double>::infinity());
  // Subnormals: multiples of 2^-24 below 2^-14.
  EXPECT_EQ(round_to_fp16(0x1p-24), 0x1p-24);
  EXPECT_EQ(round_to_fp16(0x1p-25), 0.0);  // tie: to the even 0
  EXPECT_EQ(round_to_fp16(0x1p-25 + 0x1p-40), 0x1p-24);
  EXPECT_EQ(round_to_fp16(3 * 0x1p-25), 0x1p-23);  // tie between 1 and 2 ulps: 2
  EXPECT_EQ(round_to_fp16(1023 * 0x1p-24), 1023 * 0x1p-24);
  EXPECT_EQ(round_to_fp16(0x1p-14 - 0x1p-25), 0x1p-14);  // tie into the normals: the even 2^-14
  EXPECT_EQ(round_to_fp16(0x1p-14 + 0x1p-24), 0x1p-14 + 0x1p-24);
  EXPECT_TRUE(std::signbit(round_to_fp16(-0.0)));
  EXPECT_TRUE(std::signbit(round_to_fp16(-0x1p-30)));
  EXPECT_TRUE(std::isnan(round_to_fp16(std::nan(""))));
}

#if defined(__FLT16_MANT_DIG__)
TEST(RoundToFp16, EqualsTheCompilersFloat16) {
  // Every float16 value and every midpoint between neighbours (the ties), nudged either way by one
  // double ulp, and random doubles over the whole range.
  std::vector<double> inputs;
  for (double x = 0x1p-26; x < 70000; x *= 1.0001) inputs.push_back(x);
  for (int m = 0; m < 2048 * 31; ++m) {
    const double value = m < 1024 ? m * 0x1p-24 : std::ldexp(1024 + m % 1024, m / 1024 - 25);
    for (double x : {value, value + std::ldexp(value > 0 ? value : 0x1p-24, -12)}) {
      inputs.push_back(x);
      inputs.push_back(std::nextafter(x, 0.0));
      inputs.push_back(std::nextafter(x, 1e9));
    }
  }
  std::mt19937_64 random(7);
  for (int i = 0; i < 200000; ++i) {
    inputs.push_back(std::ldexp(std::uniform_real_distribution<double>(0.5, 1.0)(random),
                                std::uniform_int_distribution<int>(-30, 17)(random)));
  }
  int64_t checked = 0;
  for (double x : inputs) {
    for (double signed_x : {x, -x}) {
      const auto expected = static_cast<double>(static_cast<_Float16>(signed_x));
      ASSERT_EQ(round_to_fp16(signed_x), expected) << std::hexfloat << signed_x;
      ++checked;
    }
  }
  EXPECT_GT(checked, 500000);
}
#endif

TEST(StoredCopy, WhichTensorsAreCopies) {
  EXPECT_TRUE(stored_copy_of("params", "bfloat16"));
  EXPECT_TRUE(stored_copy_of("init", "float16"));
  EXPECT_FALSE(stored_copy_of("grads", "bfloat16"));  // gradients are not copies of master weights
  EXPECT_FALSE(stored_copy_of("params", "float32"));
  EXPECT_EQ(stored_copy_of("params", "bfloat16")->unit_roundoff, 0x1p-8 + 0x1p-23);
  EXPECT_EQ(stored_copy_of("init", "float16")->unit_roundoff, 0x1p-11);
}

TEST(StoredCopy, WideningFormulas) {
  const double u = 0x1p-8 + 0x1p-23;
  const Tolerance widened = widened_tolerance(Tolerance{1e-3, 2e-3}, u);
  EXPECT_DOUBLE_EQ(widened.relative_l2, (1e-3 + u * (2 + 1e-3)) / (1 - u));
  EXPECT_DOUBLE_EQ(widened.max_abs_normalized, (2e-3 + u * (2 + 2e-3)) / (1 - u));
  EXPECT_DOUBLE_EQ(widened_bound(1e-5, -0.5, u), 1e-5 + u * (1.0 + 1e-5));
  EXPECT_TRUE(std::isnan(widened_bound(kNoElementBound, 0.5, u)));

  // judge_as_copy: the start's rounding u_s |p_i| on bounded elements, u_s ||p|| / ||g|| on the rule's,
  // then the widening; the reference rounded and typed.
  const std::vector<double> start = {0.25, -4.0};
  StoredCopy copy = *stored_copy_of("params", "float16");
  copy.start = &start;
  copy.start_unit_roundoff = u;
  Recorded reference{{2}, {0.1, 3.0}, "float64"};
  Tolerance tolerance{0.0, 0.0};
  ElementBounds bounds = {1e-4, kNoElementBound};
  judge_as_copy(copy, reference, tolerance, bounds);
  const double v = 0x1p-11;
  EXPECT_EQ(reference.dtype, "float16");
  EXPECT_EQ(reference.values, (std::vector<double>{round_to_fp16(0.1), 3.0}));
  const double eta = 0x1p-25;  // float16's subnormal error
  EXPECT_DOUBLE_EQ(bounds[0], (1e-4 + u * 0.25) + v * (2 * 0.1 + 1e-4 + u * 0.25) + 2 * eta);
  EXPECT_TRUE(std::isnan(bounds[1]));
  const double tau = (u * 4.0 / 3.0 + v * (2 + u * 4.0 / 3.0)) / (1 - v), a = eta / 3.0;
  EXPECT_DOUBLE_EQ(tolerance.relative_l2, tau + a * (tau + 2));
  EXPECT_DOUBLE_EQ(tolerance.max_abs_normalized, tolerance.relative_l2);
  EXPECT_EQ(widened_bound(0.0, 0.0, v, eta), 2 * eta);
}

// The widened bounds hold in the worst case they are derived for: m within b (or tau) of g, both
// rounded, over many random values and both types; and they are not loose by more than the derivation
// says (some case comes within a factor 2 of the per-element bound).
TEST(StoredCopy, WidenedBoundsHoldForRoundedValues) {
  std::mt19937_64 random(11);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  for (const std::string type : {"bfloat16", "float16"}) {
    const double u = copy_unit_roundoff(type);
    double closest = 0.0;
    for (int i = 0; i < 200000; ++i) {
      const double g = std::ldexp(unit(random), -(i % 30));  // float16 subnormals below 2^-14
      const double b = std::fabs(g) * std::ldexp(std::fabs(unit(random)), -(i % 20));
      const double m = g + b * unit(random);
      const double error = std::fabs(round_to_copy(m, type) - round_to_copy(g, type));
      const double bound = widened_bound(b, g, u, copy_subnormal_error(type));
      ASSERT_LE(error, bound) << type << std::hexfloat << " g " << g << " m " << m;
      closest = std::max(closest, error / bound);
    }
    EXPECT_GT(closest, 0.5) << type;
    for (int trial = 0; trial < 200; ++trial) {
      const double tau = std::ldexp(1.0, -(trial % 30));
      std::vector<double> g(64), m(64);
      double g2 = 0, d2 = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = unit(random);
        const double d = unit(random);
        m[i] = d;
        g2 += g[i] * g[i];
        d2 += d * d;
      }
      for (size_t i = 0; i < g.size(); ++i)
        m[i] = g[i] + m[i] * tau * std::sqrt(g2 / d2);  // ||m-g|| = tau ||g||
      double e2 = 0, r2 = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        const double r = round_to_copy(g[i], type);
        e2 += std::pow(round_to_copy(m[i], type) - r, 2);
        r2 += r * r;
      }
      const double a = copy_subnormal_error(type) * std::sqrt(64.0) / std::sqrt(r2);
      ASSERT_LE(std::sqrt(e2 / r2), widened_tolerance(Tolerance{tau, tau}, u, a, 0.0).relative_l2)
          << type << " " << tau;
    }
  }
}

TEST(StoredCopy, UlpsOfSixteenBitTypes) {
  EXPECT_EQ(ulp_distance(1.0, 1 + 0x1p-7, "bfloat16"), 1u);
  EXPECT_EQ(ulp_distance(1.0, 1 + 0x1p-10, "float16"), 1u);
  EXPECT_EQ(ulp_distance(1.0, 1.0 - 0x1p-11, "float16"), 1u);  // across a power of two
  EXPECT_EQ(ulp_distance(0x1p-24, -0x1p-24, "float16"), 2u);   // across zero, subnormals
  EXPECT_EQ(ulp_distance(0x1p-14, 1023 * 0x1p-24, "float16"), 1u);
  EXPECT_EQ(ulp_distance(65504.0, std::numeric_limits<double>::infinity(), "float16"), 1u);
  EXPECT_EQ(ulp_distance(0x1p-126, 0x1p-126 - 0x1p-133, "bfloat16"), 1u);
  EXPECT_EQ(ulp_distance(3.0, 3.0, "bfloat16"), 0u);
  EXPECT_EQ(ulp_distance(1.0, 2.0, "bfloat16"), 128u);
  const Recorded a{{2}, {1.0, 2.0}, "bfloat16"}, b{{2}, {1.0, 2.0 + 0x1p-6}, "bfloat16"};
  const TensorMetrics metrics = compare_values(a, b, Tolerance{1, 1});
  EXPECT_TRUE(metrics.has_ulp);
  EXPECT_EQ(metrics.max_ulp, 1u);
}

// ---- through the diff ----

struct CopyTag {
  static constexpr const char* kDirectory = "touchstone_stored_copy";
};
using StoredCopies = ThreeGoldenFiles<CopyTag>;

// The candidate's datasets as float32 HDF5 datasets with stored_dtype `type` on the parameters.
std::string write_copies(const GoldenRun& golden, const TensorMap& tensors, const std::string& name,
                         const std::string& type) {
  const std::string path = (fs::path(golden.path).parent_path() / (name + ".h5")).string();
  h5::H5Writer writer(path);
  for (const auto& [dataset, t] : tensors) {
    const bool copy = dataset.find("/params/") != std::string::npos || dataset.rfind("params/init/", 0) == 0;
    if (t.dtype == "int64") {
      writer.write_scalar_i64("/" + dataset, static_cast<int64_t>(t.values.at(0)));
    } else if (copy) {
      writer.write_f32("/" + dataset, t.values.data(), t.shape);
      writer.set_attribute("/" + dataset, "stored_dtype", type);
    } else {
      writer.write_f64("/" + dataset, t.values.data(), t.shape);
    }
  }
  writer.commit();
  return path;
}

TensorMap params_of(const GoldenRun& golden, const ParamTensors& params, int64_t step,
                    const std::string& type) {
  TensorMap out;
  for (int id = 0; id < golden.table->size(); ++id) {
    Recorded t{(*golden.table)[id].shape, params[id], "float64"};
    for (double& x : t.values) x = round_to_copy(x, type);
    out["steps/" + std::to_string(step) + "/params/" + (*golden.table)[id].name] = t;
  }
  return out;
}

TEST_F(StoredCopies, TheGoldenParametersRoundedPassExactly) {
  for (const std::string type : {"bfloat16", "float16"}) {
    SCOPED_TRACE(type);
    const std::string path =
        write_copies(*masked_, params_of(*masked_, masked_->params_after(1), 1, type), "exact_" + type, type);
    const DiffResult result = run_analysis(masked_->path, path, AnalysisOptions{});
    EXPECT_EQ(result.exit_status(), 0) << describe(result);
    int compared = 0;
    for (const Entry& e : result.entries) {
      if (e.status == Status::kNotCompared) continue;
      ++compared;
      EXPECT_EQ(e.metrics.relative_l2, 0.0) << e.path;
      EXPECT_TRUE(e.metrics.has_ulp) << e.path;
      EXPECT_EQ(e.metrics.max_ulp, 0u) << e.path;
      // The FP64 file's 1e-10 widened by one rounding on each side; the subnormals' term adds about
      // 2 eta sqrt(n) / ||g|| (float16: 2^-24 sqrt(512) / 4.5 = 3e-7 for elements of size 0.2, 3e-4 of it).
      const double widened =
          widened_tolerance(Tolerance{kFp64Tolerance, kFp64Tolerance}, copy_unit_roundoff(type)).relative_l2;
      EXPECT_GE(e.tolerance.relative_l2, widened) << e.path;
      EXPECT_LE(e.tolerance.relative_l2, widened * (1 + 1e-3)) << e.path;
    }
    EXPECT_EQ(compared, masked_->table->size());
    const std::string note = copy_note("steps/1/params", type);
    EXPECT_EQ(std::count(result.notes.begin(), result.notes.end(), note), 1) << describe(result);
  }
}

// float16: this config's update moves linear_fc1 by 0.5% relative (lr 1e-3 on weights of size 0.2),
// which two float16 roundings (2 x 2^-11 = 0.1%) leave visible and two bfloat16 ones (0.8%) would not.
TEST_F(StoredCopies, AnUpdateLeftOutFailsThatTensor) {
  TensorMap candidate = params_of(*masked_, masked_->params_after(1), 1, "float16");
  const int fc1 = masked_->table->layer(1).fc1;
  const std::string name = (*masked_->table)[fc1].name;
  candidate["steps/1/params/" + name].values = masked_->init[fc1];
  for (double& x : candidate["steps/1/params/" + name].values) x = round_to_fp16(x);
  const DiffResult result = run_analysis(
      masked_->path, write_copies(*masked_, candidate, "left_out", "float16"), AnalysisOptions{});
  EXPECT_EQ(result.exit_status(), 1) << describe(result);
  for (const Entry& e : result.entries) {
    if (e.status == Status::kNotCompared) continue;
    EXPECT_EQ(e.status, e.name == name ? Status::kFail : Status::kPass) << e.path;
  }
}

TEST_F(StoredCopies, ALearningRateBehindIsNamedOnBf16Parameters) {
  // Golden gradients of step 1 with parameters from AdamW at update 0's rate (0: the warm-up's start),
  // rounded to bfloat16: the optimizer check fails them and the behind rule, rounded and widened the
  // same way, matches.
  TensorMap candidate = golden_datasets(masked_->path);
  for (auto it = candidate.begin(); it != candidate.end();) {
    it = it->first.rfind("steps/1/grads/", 0) == 0 || it->first == "steps/1/grad_norm" ? std::next(it)
                                                                                       : candidate.erase(it);
  }
  for (auto& [name, t] : params_of(*masked_, masked_->init, 1, "bfloat16")) candidate[name] = t;
  const DiffResult result =
      run_analysis(masked_->path, write_copies(*masked_, candidate, "behind", "bfloat16"), AnalysisOptions{});
  expect_verdicts(result, {"learning_rate_behind"});
  for (const Entry& e : result.entries) {
    if (e.group == "params") {
      EXPECT_EQ(e.basis, Basis::kOptimizer) << e.path;
    }
  }
  // The correct update rounded to bfloat16 passes the optimizer check.
  for (auto& [name, t] : params_of(*masked_, masked_->params_after(1), 1, "bfloat16")) candidate[name] = t;
  const DiffResult correct = run_analysis(
      masked_->path, write_copies(*masked_, candidate, "correct", "bfloat16"), AnalysisOptions{});
  EXPECT_EQ(correct.exit_status(), 0) << describe(correct);
}

TEST_F(StoredCopies, TheAttributeIsChecked) {
  const std::string name = (*masked_->table)[0].name;
  const std::string path = (fs::path(masked_->path).parent_path() / "attribute.h5").string();
  auto write = [&](double value, const std::string& type) {
    h5::H5Writer writer(path);
    std::vector<double> values(static_cast<size_t>((*masked_->table)[0].numel()), 0.5);
    values[3] = value;
    writer.write_f32("/steps/1/params/" + name, values.data(), (*masked_->table)[0].shape);
    writer.set_attribute("/steps/1/params/" + name, "stored_dtype", type);
    writer.commit();
  };
  const int64_t columns = (*masked_->table)[0].shape.at(1);
  write(0.1, "bfloat16");
  try {
    run_analysis(masked_->path, path, AnalysisOptions{});
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": steps/1/params/" + name + ": stored_dtype bfloat16, but element " +
                  shape_text({3 / columns, 3 % columns}) + " = 0.100000001 is not a bfloat16 number");
  }
  write(0.1, "int8");
  EXPECT_THROW(run_analysis(masked_->path, path, AnalysisOptions{}), InputError);
  write(std::numeric_limits<double>::infinity(), "float16");  // non-finite values are not checked
  EXPECT_NO_THROW(run_analysis(masked_->path, path, AnalysisOptions{}));
}

}  // namespace
}  // namespace touchstone::diff::testing
