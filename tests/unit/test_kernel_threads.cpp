// The CPU kernels that run on several threads give bitwise the same outputs on 1, 2 and 3 threads, in
// every precision, and OpenBLAS's own threads sleep between calls (kernels/cpu/parallel_for.h).
#include <cblas.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/rng.h"
#include "kernel_threads_guard.h"
#include "kernels/backend.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_for.h"

namespace touchstone {
namespace {

using Buffers = std::vector<std::vector<double>>;

using testing::KernelThreadsGuard;

std::vector<double> random_values(int64_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = normal(generator);
  return v;
}

std::vector<int32_t> random_tokens(int64_t n, int32_t upper, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> token(0, upper - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& t : v) t = token(generator);
  return v;
}

// Runs `op` (which returns its outputs, computed from fresh copies of its inputs) on 1, 2 and 3 kernel
// threads and expects every output buffer bitwise equal to the single-threaded one.
void expect_same_bits_on_any_thread_count(const std::string& name, const std::function<Buffers()>& op) {
  const KernelThreadsGuard guard;
  cpu::set_kernel_threads(1);
  const Buffers serial = op();
  for (const int threads : {2, 3}) {
    cpu::set_kernel_threads(threads);
    const Buffers parallel = op();
    ASSERT_EQ(parallel.size(), serial.size()) << name;
    for (size_t b = 0; b < serial.size(); ++b) {
      ASSERT_EQ(parallel[b].size(), serial[b].size()) << name << " output " << b;
      EXPECT_EQ(std::memcmp(parallel[b].data(), serial[b].data(), serial[b].size() * sizeof(double)), 0)
          << name << " output " << b << " on " << threads << " threads differs from 1 thread";
    }
  }
}

class KernelThreads : public ::testing::TestWithParam<Precision> {
 protected:
  std::unique_ptr<Backend> backend(bool grad_accumulation_fusion = true) const {
    return make_cpu_backend(BackendOptions{GetParam(), grad_accumulation_fusion});
  }
};

// Odd sizes, so that no thread's chunk is a round number of rows or columns (KernelThreadsGuard splits
// every loop, however small).
constexpr int64_t kRows = 37, kHidden = 456, kFfn = 451, kVocab = 1001;

TEST(KernelThreadsSetup, ParallelForRunsOnTheThreadsSet) {
  // Without this the bitwise comparisons below could pass on a build where everything runs serially.
  const KernelThreadsGuard guard;
  cpu::set_kernel_threads(3);
  EXPECT_EQ(cpu::kernel_threads(), 3);
  std::mutex mutex;
  std::set<std::thread::id> ids;
  cpu::parallel_for(3, [&](int64_t) {
    // Long enough that one thread cannot finish every index before the others start.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::lock_guard<std::mutex> lock(mutex);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 3u);
}

// The CPU time of every thread of this process so far, in seconds.
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

TEST(KernelThreadsSetup, BlasThreadsSleepAfterAGemm) {
  // A threaded GEMM's result, before OpenBLAS's workers are restarted and after: the same bits.
  openblas_set_num_threads(2);  // a worker thread on any machine
  const int64_t n = 256;
  const auto a = random_values(n * n, 31), b = random_values(n * n, 32);
  const auto product = [&] {
    std::vector<double> c(static_cast<size_t>(n * n));
    cpu::gemm(Precision::kFp64, cpu::RoundTo::kNone, false, false, n, n, n, 1.0, a.data(), n, b.data(), n,
              cpu::Store::kOverwrite, c.data(), n);
    return c;
  };
  const std::vector<double> before = product();
  unsetenv("OPENBLAS_THREAD_TIMEOUT");  // what runs here is this process's choice, not its caller's
  cpu::let_blas_threads_sleep();
  const char* timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  ASSERT_NE(timeout, nullptr);
  EXPECT_STREQ(timeout, "4");
  const std::vector<double> after = product();
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(double)), 0);
  // Idle for 300 ms after the GEMM: a spinning worker would use 2^28 processor cycles of it (0.08 s at
  // 3.5 GHz, more on slower clocks); a sleeping one next to nothing. 20 ms is a quarter of the least
  // spin, and far above the wake-ups of a sleeping process.
  const double cpu_before = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(process_cpu_seconds() - cpu_before, 0.02);
}

TEST_P(KernelThreads, RmsNorm) {
  auto b = backend();
  const auto x = random_values(kRows * kHidden, 1), weight = random_values(kHidden, 2),
             dy = random_values(kRows * kHidden, 3), dweight0 = random_values(kHidden, 4);
  expect_same_bits_on_any_thread_count("rmsnorm", [&] {
    std::vector<double> y(x.size()), rstd(kRows), dx(x.size()), dweight = dweight0;
    b->rmsnorm_forward(x.data(), weight.data(), kRows, kHidden, 1e-5, y.data(), rstd.data());
    b->rmsnorm_backward(dy.data(), x.data(), weight.data(), rstd.data(), kRows, kHidden, dx.data(),
                        dweight.data());
    return Buffers{y, rstd, dx, dweight};
  });
}

TEST_P(KernelThreads, QkvLayoutAndRope) {
  auto b = backend();
  const AttentionShape s{3, 29, 8, 2, 24};  // the query heads' RoPE: 87 tokens x 192 >= the threshold
  const int64_t rows = s.windows * s.seq, width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
  const auto qkv = random_values(rows * width, 5);
  const auto positions = random_tokens(rows, 4096, 6);
  expect_same_bits_on_any_thread_count("qkv_split, rope, qkv_merge", [&] {
    std::vector<double> q(static_cast<size_t>(rows * s.num_heads * s.head_dim)),
        k(static_cast<size_t>(rows * s.num_kv_heads * s.head_dim)), v(k.size()), merged(qkv.size());
    b->qkv_split(qkv.data(), s, q.data(), k.data(), v.data());
    b->rope(q.data(), positions.data(), s.windows, s.num_heads, s.seq, s.head_dim, 10000.0, false);
    b->rope(k.data(), positions.data(), s.windows, s.num_kv_heads, s.seq, s.head_dim, 10000.0, true);
    b->qkv_merge(q.data(), k.data(), v.data(), s, merged.data());
    return Buffers{q, k, v, merged};
  });
}

TEST_P(KernelThreads, SwiGlu) {
  auto b = backend();
  const auto fc1 = random_values(kRows * 2 * kFfn, 7, 3.0), dact = random_values(kRows * kFfn, 8);
  expect_same_bits_on_any_thread_count("swiglu", [&] {
    std::vector<double> act(dact.size()), dfc1(fc1.size()), act_again(dact.size());
    b->swiglu_forward(fc1.data(), kRows, kFfn, act.data());
    b->swiglu_backward(dact.data(), fc1.data(), kRows, kFfn, dfc1.data(), act_again.data());
    EXPECT_EQ(act_again, act) << "the backward's act is the forward's, bit for bit";
    // The model's call: act written over dact, the same bits as into buffers apart.
    std::vector<double> shared = dact, dfc1_shared(fc1.size());
    b->swiglu_backward(shared.data(), fc1.data(), kRows, kFfn, dfc1_shared.data(), shared.data());
    EXPECT_EQ(dfc1_shared, dfc1) << "swiglu backward with act over dact";
    EXPECT_EQ(shared, act) << "swiglu backward with act over dact";
    return Buffers{act, dfc1};
  });
}

TEST_P(KernelThreads, CrossEntropy) {
  auto b = backend();
  // This rank's shard is [300, 300 + 1001) of a larger vocabulary: some targets fall outside it, some are
  // ignored.
  const int64_t vocab_start = 300;
  const auto logits = random_values(kRows * kVocab, 9, 4.0);
  auto targets = random_tokens(kRows, 1500, 10);
  for (size_t n = 0; n < targets.size(); n += 5) targets[n] = -100;
  expect_same_bits_on_any_thread_count("cross entropy", [&] {
    std::vector<double> row_max(kRows), sum_exp(kRows), target_logit(kRows), losses(kRows),
        dlogits(logits.size());
    b->logits_row_max(logits.data(), kRows, kVocab, row_max.data());
    b->cross_entropy_partials(logits.data(), targets.data(), kRows, kVocab, vocab_start, row_max.data(),
                              sum_exp.data(), target_logit.data());
    b->cross_entropy_loss(row_max.data(), sum_exp.data(), target_logit.data(), targets.data(), kRows,
                          losses.data());
    b->cross_entropy_backward(logits.data(), targets.data(), kRows, kVocab, vocab_start, row_max.data(),
                              sum_exp.data(), 0.37, dlogits.data());
    // The head's call: dlogits over the logits themselves, the same bits as into a buffer apart.
    std::vector<double> in_place = logits;
    b->cross_entropy_backward(in_place.data(), targets.data(), kRows, kVocab, vocab_start, row_max.data(),
                              sum_exp.data(), 0.37, in_place.data());
    EXPECT_EQ(in_place, dlogits) << "cross entropy backward in place";
    return Buffers{row_max, sum_exp, target_logit, losses, dlogits};
  });
}

TEST_P(KernelThreads, AdamW) {
  auto b = backend();
  const int64_t n = 20011;
  const auto param0 = random_values(n, 11), grad = random_values(n, 12, 1e-2),
             exp_avg0 = random_values(n, 13, 1e-3), exp_avg_sq0 = random_values(n, 14, 1e-3);
  expect_same_bits_on_any_thread_count("adamw", [&] {
    std::vector<double> param = param0, exp_avg = exp_avg0, exp_avg_sq = exp_avg_sq0;
    for (double& v : exp_avg_sq) v *= v;  // a second moment is not negative
    b->adamw_update(param.data(), grad.data(), exp_avg.data(), exp_avg_sq.data(), n,
                    AdamWStep{3e-4, 0.9, 0.95, 1e-8, 0.1, 7});
    return Buffers{param, exp_avg, exp_avg_sq};
  });
}

TEST_P(KernelThreads, HiddenDropout) {
  auto b = backend();
  const int64_t seq = 13, first_row = 5;  // rows 5 ... 41 of four windows
  const std::vector<int64_t> samples{7, 100, 3, 55};
  const DropoutSite site{stream_key(1234, "dropout/hidden_mlp/layer0"), 0.3, samples.data()};
  const auto x = random_values(kRows * kHidden, 15), dy = random_values(kRows * kHidden, 16);
  expect_same_bits_on_any_thread_count("hidden dropout", [&] {
    std::vector<double> mask(x.size()), y(x.size()), dx(x.size());
    b->hidden_dropout_mask(site, first_row, kRows, seq, kHidden, mask.data());
    b->dropout_forward(x.data(), mask.data(), kRows * kHidden, y.data());
    b->dropout_backward(dy.data(), mask.data(), kRows * kHidden, dx.data());
    return Buffers{mask, y, dx};
  });
}

TEST_P(KernelThreads, EmbeddingAddAndRound) {
  auto b = backend();
  // Tokens 0 ... 39 of which this shard holds [5, 35): repeats (summed in row order) and misses.
  const int64_t vocab_start = 5, vocab_local = 30;
  const auto tokens = random_tokens(kRows, 40, 17);
  const auto table = random_values(vocab_local * kHidden, 18), dy = random_values(kRows * kHidden, 19),
             dtable0 = random_values(vocab_local * kHidden, 20),
             residual = random_values(kRows * kHidden, 21);
  expect_same_bits_on_any_thread_count("embedding, add_inplace, round", [&] {
    std::vector<double> y(static_cast<size_t>(kRows * kHidden)), dtable = dtable0;
    b->embedding_forward(tokens.data(), table.data(), kRows, kHidden, vocab_start, vocab_local, y.data());
    b->embedding_backward(tokens.data(), dy.data(), kRows, kHidden, vocab_start, vocab_local, dtable.data());
    b->add_inplace(y.data(), residual.data(), kRows * kHidden);
    std::vector<double> state = residual, weight = residual, activation = residual;
    b->round(TensorRole::kState, state.data(), kRows * kHidden);
    b->round(TensorRole::kComputeWeight, weight.data(), kRows * kHidden);
    b->round(TensorRole::kActivation, activation.data(), kRows * kHidden);
    return Buffers{y, dtable, state, weight, activation};
  });
}

TEST_P(KernelThreads, Linear) {
  // The GEMM's conversions and stores, with and without gradient-accumulation fusion (BF16 differs).
  for (const bool fusion : {true, false}) {
    auto b = backend(fusion);
    const auto x = random_values(kRows * kHidden, 22), weight = random_values(kFfn * kHidden, 23),
               dy = random_values(kRows * kFfn, 24), dweight0 = random_values(kFfn * kHidden, 25);
    expect_same_bits_on_any_thread_count(fusion ? "linear, fused" : "linear, unfused", [&] {
      std::vector<double> y(dy.size()), dx(x.size()), dweight = dweight0;
      b->linear_forward(x.data(), weight.data(), kRows, kHidden, kFfn, y.data());
      b->linear_backward(dy.data(), x.data(), weight.data(), kRows, kHidden, kFfn, dx.data(), dweight.data());
      return Buffers{y, dx, dweight};
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, KernelThreads,
                         ::testing::Values(Precision::kFp64, Precision::kFp32, Precision::kBf16),
                         [](const ::testing::TestParamInfo<Precision>& param) {
                           return param.param == Precision::kFp64   ? std::string("Fp64")
                                  : param.param == Precision::kFp32 ? std::string("Fp32")
                                                                    : std::string("Bf16");
                         });

}  // namespace
}  // namespace touchstone
