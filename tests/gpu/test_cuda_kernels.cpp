// Every CUDA operator except attention (tests/gpu/test_cuda_attention.cpp) against the CPU reference,
// in FP64, FP32 and BF16, on shapes that are not multiples of the block size, with single rows and
// empty slices. Tolerances: gpu_compare.h's rule, with the reduction length of each output named.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/gpu/gpu_compare.h"

namespace touchstone::gpu_testing {
namespace {

class CudaKernels : public ::testing::TestWithParam<Precision> {
 protected:
  Precision p() const { return GetParam(); }
  bool bf16() const { return p() == Precision::kBf16; }
};

TEST_P(CudaKernels, LinearForwardAndBackward) {
  for (const bool fusion : {true, false}) {
    BackendPair b(p(), fusion);
    const int64_t N = 37, in = 300, out = 45;  // 300: longer than one block, not a multiple of it
    const auto x = random_values("x", N * in, p());
    const auto w = random_values("w", out * in, p(), 0.05, TensorRole::kComputeWeight);
    const auto dy = random_values("dy", N * out, p());
    std::vector<double> y_cpu(N * out), y_gpu(N * out);
    b.cpu->linear_forward(x.data(), w.data(), N, in, out, y_cpu.data());
    b.gpu->linear_forward(x.data(), w.data(), N, in, out, y_gpu.data());
    EXPECT_GPU_MATCHES(y_gpu, y_cpu, tolerance(p(), in, bf16()));  // sums over in
    std::vector<double> dx_cpu(N * in), dx_gpu(N * in);
    auto dw_cpu = random_values("dw", out * in, p(), 1.0, TensorRole::kState), dw_gpu = dw_cpu;
    b.cpu->linear_backward(dy.data(), x.data(), w.data(), N, in, out, dx_cpu.data(), dw_cpu.data());
    b.gpu->linear_backward(dy.data(), x.data(), w.data(), N, in, out, dx_gpu.data(), dw_gpu.data());
    EXPECT_GPU_MATCHES(dx_gpu, dx_cpu, tolerance(p(), out, bf16()));  // sums over out
    // The main gradient is FP32 (unless FP64); without fusion each micro-batch's part is BF16 first.
    EXPECT_GPU_MATCHES(dw_gpu, dw_cpu, tolerance(p(), N, bf16() && !fusion));  // sums over N
  }
}

TEST_P(CudaKernels, EmbeddingLookupAndGradientOfAVocabSlice) {
  BackendPair b(p());
  const int64_t N = 29, H = 7, vocab_start = 8, vocab_local = 8;
  std::vector<int32_t> tokens(N);
  for (int64_t n = 0; n < N; ++n)
    tokens[n] = static_cast<int32_t>((n * 5) % 20);  // repeats, and out of slice
  const auto table = random_values("table", vocab_local * H, p(), 1.0, TensorRole::kComputeWeight);
  std::vector<double> y_cpu(N * H), y_gpu(N * H);
  b.cpu->embedding_forward(tokens.data(), table.data(), N, H, vocab_start, vocab_local, y_cpu.data());
  b.gpu->embedding_forward(tokens.data(), table.data(), N, H, vocab_start, vocab_local, y_gpu.data());
  EXPECT_EQ(y_gpu, y_cpu);  // a copy: exact
  const auto dy = random_values("dy", N * H, p());
  auto g_cpu = random_values("g", vocab_local * H, p(), 1.0, TensorRole::kState), g_gpu = g_cpu;
  b.cpu->embedding_backward(tokens.data(), dy.data(), N, H, vocab_start, vocab_local, g_cpu.data());
  b.gpu->embedding_backward(tokens.data(), dy.data(), N, H, vocab_start, vocab_local, g_gpu.data());
  EXPECT_EQ(g_gpu, g_cpu);  // the same additions in the same order: bitwise
}

TEST_P(CudaKernels, RoundAndResidualAdd) {
  BackendPair b(p());
  const int64_t n = 1000;
  auto x_cpu = random_values("x", n, Precision::kFp64), x_gpu = x_cpu;
  for (const TensorRole role : {TensorRole::kState, TensorRole::kComputeWeight, TensorRole::kActivation}) {
    auto a = x_cpu, c = x_gpu;
    b.cpu->round(role, a.data(), n);
    b.gpu->round(role, c.data(), n);
    EXPECT_EQ(c, a);  // one rounding of each element: bitwise
  }
  const auto y = random_values("y", n, p());
  b.cpu->round(TensorRole::kActivation, x_cpu.data(), n);
  x_gpu = x_cpu;
  b.cpu->add_inplace(x_cpu.data(), y.data(), n);
  b.gpu->add_inplace(x_gpu.data(), y.data(), n);
  EXPECT_EQ(x_gpu, x_cpu);
}

TEST_P(CudaKernels, RmsNormForwardAndBackward) {
  BackendPair b(p());
  for (const int64_t H : {int64_t{1}, int64_t{8}, int64_t{300}}) {
    const int64_t N = 19;
    const auto x = random_values("x", N * H, p());
    const auto w = random_values("w", H, p(), 1.0, TensorRole::kComputeWeight);
    std::vector<double> y_cpu(N * H), y_gpu(N * H), r_cpu(N), r_gpu(N);
    b.cpu->rmsnorm_forward(x.data(), w.data(), N, H, 1e-5, y_cpu.data(), r_cpu.data());
    b.gpu->rmsnorm_forward(x.data(), w.data(), N, H, 1e-5, y_gpu.data(), r_gpu.data());
    EXPECT_GPU_MATCHES(y_gpu, y_cpu, tolerance(p(), H, bf16()));  // mean over H
    EXPECT_GPU_MATCHES(r_gpu, r_cpu, tolerance(p(), H, false));
    const auto dy = random_values("dy", N * H, p());
    std::vector<double> dx_cpu(N * H), dx_gpu(N * H);
    auto dw_cpu = random_values("dw", H, p(), 1.0, TensorRole::kState), dw_gpu = dw_cpu;
    b.cpu->rmsnorm_backward(dy.data(), x.data(), w.data(), r_cpu.data(), N, H, dx_cpu.data(), dw_cpu.data());
    b.gpu->rmsnorm_backward(dy.data(), x.data(), w.data(), r_cpu.data(), N, H, dx_gpu.data(), dw_gpu.data());
    EXPECT_GPU_MATCHES(dx_gpu, dx_cpu, tolerance(p(), H, bf16()));
    EXPECT_GPU_MATCHES(dw_gpu, dw_cpu, tolerance(p(), N, false));  // sums over N rows in the CPU's order
  }
}

TEST_P(CudaKernels, QkvLayoutRopeAndSwiglu) {
  BackendPair b(p());
  const AttentionShape s{2, 13, 4, 2, 6};  // GQA 2:1, D = 6
  const int64_t rows = s.windows * s.seq, width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
  const auto qkv = random_values("qkv", rows * width, p());
  std::vector<double> q_c(rows * 4 * 6), k_c(rows * 2 * 6), v_c(rows * 2 * 6);
  auto q_g = q_c, k_g = k_c, v_g = v_c;
  b.cpu->qkv_split(qkv.data(), s, q_c.data(), k_c.data(), v_c.data());
  b.gpu->qkv_split(qkv.data(), s, q_g.data(), k_g.data(), v_g.data());
  EXPECT_EQ(q_g, q_c);
  EXPECT_EQ(k_g, k_c);
  EXPECT_EQ(v_g, v_c);
  std::vector<double> merged_c(rows * width), merged_g(rows * width);
  b.cpu->qkv_merge(q_c.data(), k_c.data(), v_c.data(), s, merged_c.data());
  b.gpu->qkv_merge(q_c.data(), k_c.data(), v_c.data(), s, merged_g.data());
  EXPECT_EQ(merged_g, merged_c);

  std::vector<int32_t> positions(rows);
  for (int64_t i = 0; i < rows; ++i) positions[i] = static_cast<int32_t>(i % 5);  // packed documents restart
  for (const bool inverse : {false, true}) {
    auto x_c = q_c, x_g = q_c;
    b.cpu->rope(x_c.data(), positions.data(), s.windows, s.num_heads, s.seq, s.head_dim, 10000.0, inverse);
    b.gpu->rope(x_g.data(), positions.data(), s.windows, s.num_heads, s.seq, s.head_dim, 10000.0, inverse);
    EXPECT_GPU_MATCHES(x_g, x_c, tolerance(p(), 2, bf16()));  // two products per output
  }

  const int64_t N = 21, F = 300;
  const auto fc1 = random_values("fc1", N * 2 * F, p(), 2.0);
  std::vector<double> act_c(N * F), act_g(N * F);
  b.cpu->swiglu_forward(fc1.data(), N, F, act_c.data());
  b.gpu->swiglu_forward(fc1.data(), N, F, act_g.data());
  EXPECT_GPU_MATCHES(act_g, act_c, tolerance(p(), 4, bf16()));  // exp: a few ulps, no reduction
  const auto dact = random_values("dact", N * F, p());
  std::vector<double> d_c(N * 2 * F), d_g(N * 2 * F), again_c(N * F), again_g(N * F);
  b.cpu->swiglu_backward(dact.data(), fc1.data(), N, F, d_c.data(), again_c.data());
  b.gpu->swiglu_backward(dact.data(), fc1.data(), N, F, d_g.data(), again_g.data());
  EXPECT_GPU_MATCHES(d_g, d_c, tolerance(p(), 4, bf16()));
  EXPECT_EQ(again_c, act_c);  // each backend's backward act is its forward's: the same operations, bitwise
  EXPECT_EQ(again_g, act_g);
}

TEST_P(CudaKernels, DropoutMasksAreTheCpuMasksBitForBit) {
  BackendPair b(p());
  const std::vector<int64_t> samples = {7, 1000003};
  const DropoutSite site{stream_key(5, "dropout.test"), 0.3, samples.data()};
  // The attention mask is drawn inside the attention kernels: test_cuda_attention.cpp checks it there.
  std::vector<double> h_c(15 * 9), h_g(h_c.size());
  b.cpu->hidden_dropout_mask(site, 4, 15, 11, 9, h_c.data());  // rows 4..18 cross into window 1
  b.gpu->hidden_dropout_mask(site, 4, 15, 11, 9, h_g.data());
  EXPECT_EQ(h_g, h_c);
  const auto x = random_values("x", 15 * 9, p());
  std::vector<double> y_c(x.size()), y_g(x.size());
  b.cpu->dropout_forward(x.data(), h_c.data(), 15 * 9, y_c.data());
  b.gpu->dropout_forward(x.data(), h_c.data(), 15 * 9, y_g.data());
  EXPECT_EQ(y_g, y_c);  // one product, one rounding
  b.cpu->dropout_backward(x.data(), h_c.data(), 15 * 9, y_c.data());
  b.gpu->dropout_backward(x.data(), h_c.data(), 15 * 9, y_g.data());
  EXPECT_EQ(y_g, y_c);
}

TEST_P(CudaKernels, VocabParallelCrossEntropy) {
  BackendPair b(p());
  const int64_t N = 23, V = 700, vocab_start = 700;  // this rank holds ids [700, 1400)
  const auto logits = random_values("logits", N * V, p(), 3.0);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = n % 4 == 0 ? -100 : static_cast<int32_t>((n * 97) % 2100);
  std::vector<double> m_c(N), m_g(N), z_c(N), z_g(N), t_c(N), t_g(N), l_c(N), l_g(N);
  b.cpu->logits_row_max(logits.data(), N, V, m_c.data());
  b.gpu->logits_row_max(logits.data(), N, V, m_g.data());
  EXPECT_EQ(m_g, m_c);  // a max is exact
  b.cpu->cross_entropy_partials(logits.data(), targets.data(), N, V, vocab_start, m_c.data(), z_c.data(),
                                t_c.data());
  b.gpu->cross_entropy_partials(logits.data(), targets.data(), N, V, vocab_start, m_c.data(), z_g.data(),
                                t_g.data());
  EXPECT_GPU_MATCHES(z_g, z_c, tolerance(p(), V, false));  // sums over the slice
  EXPECT_EQ(t_g, t_c);
  b.cpu->cross_entropy_loss(m_c.data(), z_c.data(), t_c.data(), targets.data(), N, l_c.data());
  b.gpu->cross_entropy_loss(m_c.data(), z_c.data(), t_c.data(), targets.data(), N, l_g.data());
  EXPECT_GPU_MATCHES(l_g, l_c, tolerance(p(), 2, false));  // log and two additions
  std::vector<double> d_c(N * V), d_g(N * V);
  b.cpu->cross_entropy_backward(logits.data(), targets.data(), N, V, vocab_start, m_c.data(), z_c.data(),
                                0.01, d_c.data());
  b.gpu->cross_entropy_backward(logits.data(), targets.data(), N, V, vocab_start, m_c.data(), z_c.data(),
                                0.01, d_g.data());
  EXPECT_GPU_MATCHES(d_g, d_c, tolerance(p(), 4, bf16()));  // exp and a division per element
}

TEST_P(CudaKernels, AdamW) {
  BackendPair b(p());
  const int64_t n = 1001;
  auto param_c = random_values("param", n, p(), 1.0, TensorRole::kState), param_g = param_c;
  const auto grad = random_values("grad", n, p(), 1.0, TensorRole::kState);
  auto m_c = random_values("m", n, p(), 0.1, TensorRole::kState), m_g = m_c;
  auto v_c = random_values("v", n, p(), 0.1, TensorRole::kState), v_g = v_c;
  for (double& v : v_c) v = v * v;
  v_g = v_c;
  AdamWStep step{1e-3, 0.9, 0.95, 1e-8, 0.1, 3};
  step.grad_scale = 0.8125;  // a clip coefficient, applied to each gradient element in double
  b.cpu->adamw_update(param_c.data(), grad.data(), m_c.data(), v_c.data(), n, step);
  b.gpu->adamw_update(param_g.data(), grad.data(), m_g.data(), v_g.data(), n, step);
  // Elementwise in the CPU's operation order; a sqrt and divisions can differ by an ulp.
  EXPECT_GPU_MATCHES(param_g, param_c, tolerance(p(), 4, false));
  EXPECT_GPU_MATCHES(m_g, m_c, tolerance(p(), 2, false));
  EXPECT_GPU_MATCHES(v_g, v_c, tolerance(p(), 2, false));
}

TEST_P(CudaKernels, TwoIdenticalCallsGiveIdenticalBits) {
  BackendPair b(p());
  const int64_t N = 37, in = 300, out = 45;
  const auto x = random_values("x", N * in, p());
  const auto w = random_values("w", out * in, p(), 0.05, TensorRole::kComputeWeight);
  std::vector<double> first(N * out), second(N * out), r1(N), r2(N), n1(N * in), n2(N * in);
  b.gpu->linear_forward(x.data(), w.data(), N, in, out, first.data());
  b.gpu->linear_forward(x.data(), w.data(), N, in, out, second.data());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(double)), 0);
  const auto norm_w = random_values("nw", in, p(), 1.0, TensorRole::kComputeWeight);
  b.gpu->rmsnorm_forward(x.data(), norm_w.data(), N, in, 1e-5, n1.data(), r1.data());
  b.gpu->rmsnorm_forward(x.data(), norm_w.data(), N, in, 1e-5, n2.data(), r2.data());
  EXPECT_EQ(std::memcmp(n1.data(), n2.data(), n1.size() * sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(double)), 0);
}

INSTANTIATE_TEST_SUITE_P(AllPrecisions, CudaKernels, ::testing::ValuesIn(kAllPrecisions),
                         [](const auto& test) { return option_name(test.param); });

}  // namespace
}  // namespace touchstone::gpu_testing
