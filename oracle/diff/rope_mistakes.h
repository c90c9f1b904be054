// RoPE as two common mistakes compute it, for the hypotheses of hypotheses.cpp. The golden model rotates
// the pair (i, i + D/2) of every head by pos * theta^(-2i/D) ("rotate half", Megatron-Core's and Hugging
// Face's Llama). Two mistakes a conversion between frameworks makes:
//
//   kAdjacentPairs  the pair (2i, 2i + 1) is rotated by that angle instead: the convention of Meta's
//                   original Llama code and torchtitan (complex numbers over adjacent pairs), run on
//                   weights laid out for rotate-half without permuting each head's q and k rows.
//   kCosineOnly     each pair scaled by cos(angle), not rotated: a complex cos + i sin table cast to a
//                   real dtype keeps its real part (torchtitan's `model.to(torch.float64)` casts its
//                   freqs_cis buffer so, with a UserWarning), and x * cos is what the product leaves.
//
// Everything else is the FP64 CPU reference backend. Both forms are linear in x, and `inverse` (the
// backward, which applies the transpose) is the same formula with the angle negated: for the pairs a
// rotation back, for the cosine the same scaling.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/cpu_backend.h"

namespace touchstone::diff {

enum class RopeMistake { kAdjacentPairs, kCosineOnly };

class RopeMistakeBackend : public CpuBackend {
 public:
  explicit RopeMistakeBackend(RopeMistake mistake)
      : CpuBackend(BackendOptions{}), mistake_(mistake) {}  // FP64
  std::string name() const override;
  void rope(double* x, const int32_t* position_ids, int64_t windows, int64_t heads, int64_t seq,
            int64_t head_dim, double theta, bool inverse) override;

 private:
  RopeMistake mistake_;
};

}  // namespace touchstone::diff
