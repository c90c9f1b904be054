// float32_in_fp64 (float32_signature.h): the errors of a step compared with the size of FP32 rounding.
#include "oracle/diff/float32_signature.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

namespace touchstone::diff {

namespace {

// The band, in relative L2 error of each failing tensor of the step:
// - kLowest = 1e-10, the FP64 file's own tolerance (kFp64Tolerance). Two FP64 implementations that
//   differ in summation order agree to 1e-15..1e-13, so an error above it is not FP64 rounding. FP32
//   rounding, u = 2^-24 ~ 6e-8 per operation, stays far above it even when one float32 operation
//   among FP64 ones reaches a tensor damped a hundredfold.
// - kHighest = 1e-4: u amplified through one step (forward, backward, the layers' normalisations and
//   softmaxes) by up to ~1700. Touchstone's own FP32 mode, every operation in float32, gives 1e-7 to
//   1e-6 on the gradients of the signature tests' model; a wrong rule (normalisation, mask, layout,
//   targets) moves what it touches by 1e-3 or more, ten times above the band.
// - kLossHighest = 1e-5 for the loss: a forward quantity, a mean of token losses of size ~log V, which
//   FP32 rounding of the logits and the log-sum-exp moves by a few u (1e-7..1e-6), and a wrong rule by
//   1e-3 or more: a factor 10..100 from either.
// The band holds for what the forward and backward compute. An updated parameter is another matter: a
// wrong optimizer rule moves it by about the learning rate times a small factor (weight decay on a norm
// weight: ~1e-4 relative), inside the band, so parameters, moments and the rate never decide alone.
constexpr double kLowest = 1e-10;
constexpr double kHighest = 1e-4;
constexpr double kLossHighest = 1e-5;

std::string fmt(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2g", value);
  return buffer;
}

}  // namespace

std::vector<Verdict> float32_in_fp64(const GoldenReader& golden, const ToleranceModel& tolerances,
                                     const DiffResult& result, int64_t step) {
  // An envelope file's low-precision run is expected to be off by that much.
  if (golden.precision() != Precision::kFp64 || tolerances.kind() != "fp64" || step < 1) return {};
  double lowest = std::numeric_limits<double>::infinity(), highest = 0.0;
  bool forward_fails = false;  // the loss, the token losses, a gradient or the gradient norm
  for (const Entry& e : result.entries) {
    if (e.step != step || e.status == Status::kNotCompared) continue;
    const double error = e.metrics.relative_l2;
    if (e.group == "loss" && !(error < kLossHighest)) return {};
    if (e.status != Status::kFail) continue;
    // A count off by a token, a wrong shape or a NaN is no rounding.
    if (e.integer || !e.reason.empty() || !(error >= kLowest && error <= kHighest)) return {};
    lowest = std::min(lowest, error);
    highest = std::max(highest, error);
    forward_fails = forward_fails || e.group == "loss" || e.group == "token_losses" || e.group == "grads" ||
                    e.group == "grad_norm";
  }
  if (!forward_fails) return {};
  return {
      {"float32_in_fp64",
       "float32 arithmetic inside an FP64 run: every failing tensor is off by " + fmt(lowest) + ".." +
           fmt(highest) +
           " relative, the size of FP32 rounding, not of a wrong rule; some operation runs in float32 (in "
           "Hugging Face transformers: RoPE, RMSNorm and the softmax; apply "
           "touchstone.hf.exact_fp64(model))"}};
}

}  // namespace touchstone::diff
