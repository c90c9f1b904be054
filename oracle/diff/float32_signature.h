// The float32_in_fp64 signature: an FP64 candidate in which some operation runs in float32 (Hugging
// Face transformers keeps RoPE, RMSNorm and the softmax in float32 after .to(torch.float64)). It looks
// at the sizes of the errors alone: every failing tensor of the step is off by as much as FP32 rounding
// makes, far above FP64 rounding and far below a wrong rule. signatures.cpp calls it when no
// recomputed rule explains the step.
#pragma once

#include <cstdint>
#include <vector>

#include "oracle/diff/diff.h"
#include "oracle/golden/golden_reader.h"

namespace touchstone::diff {

// For an FP64 golden file (tolerance model "fp64"): a verdict when the loss, the token losses, a
// gradient or the gradient norm of `step` (1 or later) fails, every failing tensor of the step has a
// relative L2 error in [1e-10, 1e-4], none fails for a wrong shape, a non-finite value or an integer
// count, and the loss, when compared, is off by less than 1e-5 relative.
std::vector<Verdict> float32_in_fp64(const GoldenReader& golden, const ToleranceModel& tolerances,
                                     const DiffResult& result, int64_t step);

}  // namespace touchstone::diff
