// Where the backends round, per precision (docs/precision.md; the CUDA kernels use this too): every kernel
// computes in Compute<P> (double for FP64, float otherwise) and stores activations and states through these
// two functions.
#pragma once

#include "common/host_device.h"
#include "kernels/precision.h"

namespace touchstone::cpu {

struct Rounding {
  Precision precision;

  // Activations and activation gradients between operators: BF16 in BF16 mode.
  TOUCHSTONE_HOST_DEVICE double activation(double v) const {
    switch (precision) {
      case Precision::kBf16:
        return round_to_bf16(v);
      case Precision::kFp32:
        return round_to_fp32(v);
      case Precision::kFp64:
        break;
    }
    return v;
  }
  // Accumulators and optimizer state (main gradients, master weights, Adam moments): FP32 unless FP64.
  TOUCHSTONE_HOST_DEVICE double state(double v) const {
    return precision == Precision::kFp64 ? v : round_to_fp32(v);
  }
  // The weights the forward and backward passes use: the BF16 copy of the FP32 master in BF16 mode.
  TOUCHSTONE_HOST_DEVICE double weight(double v) const { return activation(v); }
};

// FP64 mode's rounding: none. The elementwise kernels' FP64 instantiations take this instead of a
// Rounding, so that their loops hold no branch on the precision and the compiler vectorizes them; the
// values are those of Rounding{Precision::kFp64}.
struct NoRounding {
  TOUCHSTONE_HOST_DEVICE double activation(double v) const { return v; }
  TOUCHSTONE_HOST_DEVICE double state(double v) const { return v; }
  TOUCHSTONE_HOST_DEVICE double weight(double v) const { return v; }
};

}  // namespace touchstone::cpu
