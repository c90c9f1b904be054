// `touchstone-attention-bench`: the CPU backend's tiled attention (kernels/cpu/attention.cpp) timed on
// its own, forward and backward of whole windows in FP64, as the long-window step runs it but without
// the rest of the step. Each repetition prints its forward and backward seconds and a fingerprint of
// every output (FNV-1a of out, lse, dq, dk and dv), so two builds can be compared for time and bits
// in one alternating run (docs/BENCHMARKS.md "Long windows").
//
//   build/tools/touchstone-attention-bench [--seq 4096] [--windows 1] [--heads 8] [--kv-heads 4]
//                                         [--head-dim 64] [--document 0] [--reps 3]
//
// The inputs are standard normal values from the counter-based generator (common/rng.h), scaled by
// 0.5; --document 0 makes each window one document (plain causal attention), --document N cuts it
// into documents of N tokens (document masking then skips the tile pairs between them).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <vector>

#include "common/hash.h"
#include "common/rng.h"
#include "common/version.h"
#include "kernels/backend.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_for.h"

namespace {

using touchstone::AttentionShape;

struct Options {
  int64_t seq = 4096, windows = 1, heads = 8, kv_heads = 4, head_dim = 64, document = 0;
  int reps = 3;
};

// n values of 0.5 N(0, 1), stream `name` of the bench's seed.
std::vector<double> draw(const char* name, int64_t n) {
  const touchstone::PhiloxKey key = touchstone::stream_key(1234, name);
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = 0.5 * touchstone::normal_at(key, i);
  return values;
}

uint64_t fingerprint(const std::vector<std::vector<double>*>& tensors) {
  uint64_t hash = touchstone::kFnv1aBasis;
  for (const std::vector<double>* t : tensors)
    hash = touchstone::fnv1a64(t->data(), t->size() * sizeof(double), hash);
  return hash;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int bench(const Options& o) {
  const AttentionShape s{o.windows, o.seq, o.heads, o.kv_heads, o.head_dim};
  const int64_t rows = o.windows * o.seq;
  touchstone::BackendOptions backend_options;
  backend_options.precision = touchstone::Precision::kFp64;
  const auto backend = touchstone::make_backend(touchstone::BackendKind::kCpu, backend_options);
  std::vector<double> q = draw("q", rows * o.heads * o.head_dim);        // [b,NH,T,D]
  std::vector<double> k = draw("k", rows * o.kv_heads * o.head_dim);     // [b,NKV,T,D]
  std::vector<double> v = draw("v", rows * o.kv_heads * o.head_dim);     // [b,NKV,T,D]
  std::vector<double> dout = draw("dout", rows * o.heads * o.head_dim);  // [b*T, NH*D]
  std::vector<double> out(dout.size()), lse(static_cast<size_t>(o.windows * o.heads * o.seq));
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<int32_t> documents(static_cast<size_t>(rows));  // [b*T]
  for (int64_t i = 0; i < rows; ++i)
    documents[static_cast<size_t>(i)] = o.document == 0 ? 0 : static_cast<int32_t>(i % o.seq / o.document);
  const touchstone::AttentionDropout no_dropout;
  std::cout << touchstone::generator_string() << "; " << touchstone::cpu::blas_description() << "; "
            << touchstone::cpu::kernel_threads() << " kernel threads; T " << o.seq << " x " << o.windows
            << ", " << o.heads << " heads, " << o.kv_heads << " KV heads, D " << o.head_dim << "\n";
  std::cout << std::fixed << std::setprecision(3);
  for (int rep = 1; rep <= o.reps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    backend->attention_forward(q.data(), k.data(), v.data(), documents.data(), true, no_dropout, s,
                               out.data(), lse.data());
    const double forward = seconds_since(start);
    const auto middle = std::chrono::steady_clock::now();
    backend->attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                documents.data(), true, no_dropout, s, dq.data(), dk.data(), dv.data());
    const double backward = seconds_since(middle);
    std::cout << "rep " << rep << "/" << o.reps << " | forward " << forward << " s | backward " << backward
              << " s | total " << forward + backward << " s | fingerprint "
              << touchstone::hex64(fingerprint({&out, &lse, &dq, &dk, &dv})) << std::endl;
  }
  const touchstone::AttentionTileCount tiles = backend->attention_tiles();
  std::cout << "tile pairs per forward: " << tiles.computed / o.reps << " computed, "
            << tiles.skipped / o.reps << " skipped\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"The CPU backend's tiled attention, forward and backward in FP64, timed on its own"};
  app.add_option("--seq", o.seq, "Window length T")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--windows", o.windows, "Windows b")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--heads", o.heads, "Query heads NH")->check(CLI::Range(int64_t{1}, int64_t{256}));
  app.add_option("--kv-heads", o.kv_heads, "KV heads NKV (divides NH)")
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  app.add_option("--head-dim", o.head_dim, "Head dimension D")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--document", o.document, "Document length (0: one document per window)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--reps", o.reps, "Repetitions")->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (o.heads % o.kv_heads != 0) {
    std::cerr << "error: --kv-heads " << o.kv_heads << " does not divide --heads " << o.heads << "\n";
    return 2;
  }
  // The largest buffers (q, out, dout, dq) at most 2^27 doubles (1 GiB) each, checked before any is
  // allocated (the ranges above keep the product within int64).
  const int64_t largest = o.windows * o.seq * o.heads * o.head_dim;
  if (largest > (int64_t{1} << 27)) {
    std::cerr << "error: --windows x --seq x --heads x --head-dim is " << largest << ", above 2^27\n";
    return 2;
  }
  return bench(o);
}
