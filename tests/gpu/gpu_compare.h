// Shared by the GPU tests: random operands keyed by name (the same numbers on every run), the CPU
// and CUDA backends side by side, and the error measure with the tolerance rules of docs/cuda.md.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_device.h"

namespace touchstone::gpu_testing {

// n values ~ N(0, scale^2) from the stream `name`, stored as `role` in `precision` (so BF16 operands
// hold BF16 values, as the model hands them to a BF16 backend).
inline std::vector<double> random_values(const std::string& name, int64_t n, Precision precision,
                                         double scale = 1.0, TensorRole role = TensorRole::kActivation) {
  std::vector<double> v(static_cast<size_t>(n));
  const PhiloxKey key = stream_key(1234, name);
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = scale * normal_at(key, static_cast<uint64_t>(i));
  make_cpu_backend(BackendOptions{precision, true})->round(role, v.data(), n);
  return v;
}

// ||gpu - cpu||_2
inline double l2_distance(const std::vector<double>& gpu, const std::vector<double>& cpu) {
  double diff = 0.0;
  for (size_t i = 0; i < cpu.size(); ++i) diff += (gpu[i] - cpu[i]) * (gpu[i] - cpu[i]);
  return std::sqrt(diff);
}

// ||gpu - cpu||_2 / ||cpu||_2 (the absolute L2 norm when cpu is all zeros).
inline double relative_l2(const std::vector<double>& gpu, const std::vector<double>& cpu) {
  double norm = 0.0;
  for (const double x : cpu) norm += x * x;
  return norm > 0.0 ? l2_distance(gpu, cpu) / std::sqrt(norm) : l2_distance(gpu, cpu);
}

// The tolerance of a GPU result against the CPU reference of the same precision. Both sum the same
// terms in different orders: each order's rounding error is at most about L u |terms| for a
// reduction of length L and unit roundoff u, so FP64 results (u = 2^-53) stay within
// L * 2^-53 * 8 (8: headroom for the conditioning of the sums, measured below 1 on these random
// operands). A result stored in BF16 or FP32 can round to the neighbouring value when the FP32 sums
// differ in their last bits: one unit of the storage format, 2^-7 relative for BF16 (the widest
// spacing relative to the value) and 2^-23 for FP32, plus the FP32 accumulation's L * 2^-24.
inline double tolerance(Precision precision, int64_t reduction_length, bool stored_in_bf16) {
  const auto L = static_cast<double>(reduction_length);
  switch (precision) {
    case Precision::kFp64:
      return 8.0 * L * 0x1.0p-53;
    case Precision::kFp32:
      return 0x1.0p-23 + 8.0 * L * 0x1.0p-24;
    case Precision::kBf16:
      return (stored_in_bf16 ? 0x1.0p-7 : 0x1.0p-23) + 8.0 * L * 0x1.0p-24;
  }
  return 0.0;
}

// The CPU reference and the CUDA backend of one precision.
struct BackendPair {
  explicit BackendPair(Precision precision, bool grad_accumulation_fusion = true)
      : options{precision, grad_accumulation_fusion},
        cpu(make_cpu_backend(options)),
        gpu(make_backend(BackendKind::kCuda, options)) {}
  BackendOptions options;
  std::unique_ptr<Backend> cpu, gpu;
};

inline const Precision kAllPrecisions[] = {Precision::kFp64, Precision::kFp32, Precision::kBf16};

#define EXPECT_GPU_MATCHES(gpu_values, cpu_values, tol)                                             \
  do {                                                                                              \
    const double touchstone_error = ::touchstone::gpu_testing::relative_l2(gpu_values, cpu_values); \
    EXPECT_LE(touchstone_error, tol) << #gpu_values " vs CPU, relative L2";                         \
  } while (0)

}  // namespace touchstone::gpu_testing
