// The dropout masks' formula in device code (kernels/dropout_mask.h is the host's): one element drawn
// from its global coordinates with the shared Philox code (common/philox.h), so a mask a kernel draws is
// bitwise the CPU's, whether dropout.cu stores it or the attention kernels draw it where they use it.
#pragma once

#include <cstdint>

#include "common/philox.h"
#include "kernels/backend.h"
#include "kernels/cuda/device.cuh"
#include "kernels/dropout_mask.h"

namespace touchstone::cuda {

#if defined(__CUDACC__) || defined(TOUCHSTONE_CUDA_EMULATION)

// `kept` where uniform_at(key, sample, element) > p, else 0 (dropout_keep_scale).
__device__ inline double keep_scale_at(uint32_t key0, uint32_t key1, double probability, int64_t sample,
                                       int64_t element, double kept) {
  const double u =
      philox::uniform_at(key0, key1, static_cast<uint64_t>(sample), static_cast<uint64_t>(element));
  return u > probability ? kept : 0.0;  // u in (0, 1]: kept with probability 1 - p
}

#endif

// AttentionDropout as a kernel argument: the mask of local (w, h, i, j) is element
// ((first_head + h) * T + i) * T + j (attention_dropout_element) of sample samples[w].
struct AttentionKeep {
  bool active = false;
  uint32_t key0 = 0, key1 = 0;
  double probability = 0.0;
  double kept = 0.0;                 // 1 / (1 - p) in the multiply's format (dropout_kept_value)
  const int64_t* samples = nullptr;  // [b] on the device
  int64_t first_head = 0;

#if defined(__CUDACC__) || defined(TOUCHSTONE_CUDA_EMULATION)
  __device__ double at(int64_t w, int64_t h, int64_t i, int64_t j, int64_t seq) const {
    return keep_scale_at(key0, key1, probability, samples[w],
                         attention_dropout_element(first_head + h, i, j, seq), kept);
  }
#endif
};

}  // namespace touchstone::cuda
