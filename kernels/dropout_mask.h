// The dropout masks' one formula (docs/architecture.md "Dropout"), for every backend's kernels and the
// tests: an element is kept iff uniform_at(site key, global sample, element) > p, and a kept element
// is scaled by 1 / (1 - p) in the format the multiply runs in (FP32 unless FP64, as PyTorch's dropout
// kernel scales a BF16 tensor in float).
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "kernels/backend.h"
#include "kernels/cpu/rounding.h"

namespace touchstone {

// 1 / (1 - p) as the multiply holds it.
inline double dropout_kept_value(double probability, const cpu::Rounding& r) {
  return r.state(1.0 / (1.0 - probability));
}

// The mask value of `element` of global sample `sample`: `kept` or 0.
inline double dropout_keep_scale(const DropoutSite& site, int64_t sample, int64_t element, double kept) {
  const double u = uniform_at(site.key, static_cast<uint64_t>(sample), static_cast<uint64_t>(element));
  return u > site.probability ? kept : 0.0;  // u in (0, 1]: kept with probability 1 - p
}

// The element of the attention probabilities' mask for (global head, query i, key j) in a window of T
// (device code too: kernels/cuda/dropout_mask.cuh).
TOUCHSTONE_HOST_DEVICE inline int64_t attention_dropout_element(int64_t global_head, int64_t i, int64_t j,
                                                                int64_t seq) {
  return (global_head * seq + i) * seq + j;
}

// The whole attention dropout mask keep_scale[b,NH,T,T] that the attention kernels draw tile by tile,
// in `precision`'s multiply format: for tests of the mask itself and of attention against it.
inline void fill_attention_dropout_mask(const DropoutSite& site, const AttentionShape& s, int64_t first_head,
                                        Precision precision, double* keep_scale) {
  const double kept = dropout_kept_value(site.probability, cpu::Rounding{precision});
  for (int64_t w = 0; w < s.windows; ++w) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      for (int64_t i = 0; i < s.seq; ++i) {
        for (int64_t j = 0; j < s.seq; ++j) {
          keep_scale[((w * s.num_heads + h) * s.seq + i) * s.seq + j] = dropout_keep_scale(
              site, site.sample_indices[w], attention_dropout_element(first_head + h, i, j, s.seq), kept);
        }
      }
    }
  }
}

}  // namespace touchstone
