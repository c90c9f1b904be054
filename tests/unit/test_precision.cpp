// The number formats and the precision modes: FP32 -> BF16 rounding on every FP32 bit pattern, a BF16
// GEMM inside its error bound, and FP32 / BF16 training steps against FP64 (docs/precision.md).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/gemm.h"
#include "kernels/precision.h"
#include "model/params.h"
#include "oracle/run.h"
#include "oracle/train_step.h"
#include "test_support.h"

namespace touchstone {
namespace {

// The reference definition of FP32 -> BF16 round-to-nearest-even, written as the arithmetic it means:
// the two BF16 neighbours of x (truncation toward zero and one BF16 ulp further), the nearer one, the
// one with an even last mantissa bit on a tie; past the largest finite BF16 the further neighbour is
// infinity. NaN maps to a NaN.
uint16_t reference_bf16(uint32_t bits) {
  const float x = std::bit_cast<float>(bits);
  if (std::isnan(x)) return 0x7fc0;
  const auto toward_zero = static_cast<uint16_t>(bits >> 16);
  if (std::isinf(x) || (bits & 0xffffu) == 0) return toward_zero;
  const auto away = static_cast<uint16_t>(toward_zero + 1);  // may become +-infinity: the exponent carries
  const double near = std::abs(static_cast<double>(float_from_bf16_bits(toward_zero)));
  const int exponent = static_cast<int>((toward_zero >> 7) & 0xff);
  const double ulp = std::ldexp(1.0, (exponent == 0 ? 1 : exponent) - 127 - 7);  // subnormals share 2^-133
  const double far = near + ulp;
  const double magnitude = std::abs(static_cast<double>(x));
  if (magnitude - near < far - magnitude) return toward_zero;
  if (magnitude - near > far - magnitude) return away;
  return (toward_zero & 1u) == 0 ? toward_zero : away;
}

TEST(Bf16Rounding, MatchesTheReferenceOnEveryFp32BitPattern) {
  uint64_t mismatches = 0;
  for (uint64_t i = 0; i <= 0xffffffffull; ++i) {
    const auto bits = static_cast<uint32_t>(i);
    const uint16_t got = bf16_bits_from_float(std::bit_cast<float>(bits)), want = reference_bf16(bits);
    const bool both_nan = std::isnan(float_from_bf16_bits(got)) && std::isnan(float_from_bf16_bits(want));
    if (got != want && !both_nan) {
      if (mismatches++ < 5)
        ADD_FAILURE() << std::hex << "bits 0x" << bits << ": got 0x" << got << ", want 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  // Spot checks of the definition itself.
  EXPECT_EQ(reference_bf16(0x3f808000u), 0x3f80);  // tie, even stays
  EXPECT_EQ(reference_bf16(0x3f818000u), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(reference_bf16(0x7f7fffffu), 0x7f80);  // largest float overflows to infinity
  EXPECT_EQ(reference_bf16(0xff800000u), 0xff80);  // -infinity stays
}

// A BF16 GEMM (BF16 inputs, FP32 accumulation, BF16 output) against DGEMM on the same inputs. Per
// element: |c - ref| <= gamma_K(u32) * sum_k |a_ik||b_kj| + u16 * |ref| (1 + gamma_K(u32)), the
// accumulation bound of a length-K dot product in FP32 plus the final rounding to BF16
// (u32 = 2^-24, u16 = 2^-8, gamma_K = K u / (1 - K u)).
TEST(Bf16Gemm, StaysInsideItsBoundAndReallyRounds) {
  std::mt19937_64 gen(7);
  std::normal_distribution<double> normal;
  const double u32 = std::ldexp(1.0, -24), u16 = std::ldexp(1.0, -8);
  for (int64_t K : {16, 64, 256, 1024, 4096}) {
    const int64_t M = 16, N = 24;
    std::vector<double> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
    for (double& v : a) v = round_to_bf16(normal(gen));
    for (double& v : b) v = round_to_bf16(normal(gen));
    std::vector<double> c(static_cast<size_t>(M * N)), ref(static_cast<size_t>(M * N));
    cpu::gemm(Precision::kBf16, cpu::RoundTo::kBf16, false, false, M, N, K, 1.0, a.data(), K, b.data(), N,
              cpu::Store::kOverwrite, c.data(), N);
    cpu::gemm(Precision::kFp64, cpu::RoundTo::kNone, false, false, M, N, K, 1.0, a.data(), K, b.data(), N,
              cpu::Store::kOverwrite, ref.data(), N);
    const double gamma = static_cast<double>(K) * u32 / (1 - static_cast<double>(K) * u32);
    double worst_ratio = 0.0, total_error = 0.0;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        double magnitudes = 0.0;
        for (int64_t k = 0; k < K; ++k)
          magnitudes += std::abs(a[static_cast<size_t>(i * K + k)] * b[static_cast<size_t>(k * N + j)]);
        const double r = ref[static_cast<size_t>(i * N + j)];
        const double bound = gamma * magnitudes + u16 * std::abs(r) * (1 + gamma);
        const double error = std::abs(c[static_cast<size_t>(i * N + j)] - r);
        worst_ratio = std::max(worst_ratio, error / bound);
        total_error += error;
      }
    }
    EXPECT_LE(worst_ratio, 1.0) << "K = " << K;
    EXPECT_GT(total_error, 0.0) << "K = " << K << ": no rounding happened";
  }
}

// ---- training steps in FP32 and BF16 against FP64 --------------------------------------------------

Config small_config(Precision precision) {
  Config c;
  c.model.vocab_size = 64;
  c.model.hidden_size = 32;
  c.model.num_heads = 4;
  c.model.num_kv_heads = 2;
  c.model.ffn_hidden_size = 48;
  c.model.seq_length = 32;
  c.model.init_std = 0.1;
  c.precision = precision;
  return c;
}

// Gradients of step 1 from the same (FP32-representable) initial weights.
ParamTensors step1_grads(Config config, const ParamTensors& init) {
  const PreparedRun run = prepare_run(config, RunOptions{});
  auto backend = make_cpu_backend(BackendOptions{config.precision, config.train.grad_accumulation_fusion});
  SingleProcessContext single;
  Trainer trainer(config, init, *backend, single.context());
  return trainer.step(run.batches[0]).grads;
}

// The a-priori envelope of docs/precision.md: a gradient's relative L2 error against FP64 is at most
// 8 * 1.03^L * (eps_storage + sqrt(K) * eps_accumulation), eps = 2u of the format, K the longest
// reduction (here the tokens of a micro-batch, 64). Typical errors grow like sqrt(K) u, not K u.
double envelope_bound(double eps_storage, const Config& c) {
  const double eps32 = std::ldexp(1.0, -23);
  const double K = static_cast<double>(c.train.micro_batch_size * c.model.seq_length);
  return 8.0 * std::pow(1.03, static_cast<double>(c.model.num_layers)) * (eps_storage + std::sqrt(K) * eps32);
}

TEST(PrecisionModes, Fp32AndBf16StepsAgainstFp64) {
  const Config fp64 = small_config(Precision::kFp64);
  const ParamTensors init =
      prepare_run(small_config(Precision::kFp32), RunOptions{}).initial_params;  // FP32 values
  const ParamTensors reference = step1_grads(fp64, init);
  const ParamTable table(fp64.model);
  const ParamTensors fp32 = step1_grads(small_config(Precision::kFp32), init),
                     bf16 = step1_grads(small_config(Precision::kBf16), init);
  Config unfused = small_config(Precision::kBf16);
  unfused.train.grad_accumulation_fusion = false;
  const ParamTensors bf16_unfused = step1_grads(unfused, init);
  const double fp32_bound = envelope_bound(std::ldexp(1.0, -23), fp64);
  const double bf16_bound = envelope_bound(std::ldexp(1.0, -7), fp64);
  for (int id = 0; id < table.size(); ++id) {
    const double e32 = testing::relative_l2(fp32[id], reference[id]);
    const double e16 = testing::relative_l2(bf16[id], reference[id]);
    const double e16u = testing::relative_l2(bf16_unfused[id], reference[id]);
    // FP64 noise is ~1e-15: every low-precision error must be far above it and inside its envelope.
    EXPECT_GT(e32, 1e-9) << table[id].name;
    EXPECT_LE(e32, fp32_bound) << table[id].name;
    EXPECT_GT(e16, 1e-4) << table[id].name;
    EXPECT_LE(e16, bf16_bound) << table[id].name;
    EXPECT_LE(e16u, bf16_bound) << table[id].name;
    EXPECT_GT(e16, 100 * e32) << table[id].name;  // BF16 storage, not FP32 accumulation, dominates
  }
  // Rounding each micro-batch's weight gradient to BF16 is a different computation.
  const int fc1 = table.layer(0).fc1;
  EXPECT_GT(testing::relative_l2(bf16_unfused[fc1], bf16[fc1]), 1e-4);
}

}  // namespace
}  // namespace touchstone
