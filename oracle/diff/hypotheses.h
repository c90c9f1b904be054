// Signatures found by recomputation: the step's loss and gradients evaluated (in FP64, with
// oracle/train_step.h's evaluate_objective on the whole model, at the parameters the step started from:
// the candidate's own when re-anchored, else the golden ones) under rules a production run commonly
// gets wrong (the other loss normalisation, the document mask missing or applied, positions not reset,
// linear_qkv read as [q; k; v], RoPE over adjacent pairs or scaled by its cosine alone
// (rope_mistakes.h), a 0/1 attention mask added to the scores, the targets shifted once
// more, the optimizer stepping before the last micro-batch's weight gradients, ZeRO-3 computing a
// layer's backward without gathering its parameters again), each compared with the
// candidate using the tolerance its entry was judged with. A candidate
// that passes against one of them computed that rule instead of the golden one.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "oracle/diff/diff.h"
#include "oracle/golden/golden_reader.h"

namespace touchstone::diff {

// Verdicts for the rules the candidate's loss and gradients of `step` match. Needs the loss or a
// gradient in the candidate; otherwise returns nothing.
// `params`: the parameters step `step` started from; `tolerance_of(path)`: the tolerance of a dataset
// (none: it cannot decide).
// A candidate that recorded parameters but neither the loss nor gradients of the step is matched
// through its update: `update_matches(grads)` says whether its parameters after the step equal AdamW
// applied to those gradients of the step (signatures.cpp builds it from the re-anchored steps).
std::vector<Verdict> match_recomputed_rules(
    const GoldenReader& golden, const ParamTensors& params, const TensorMap& candidate, int64_t step,
    const std::function<std::optional<Tolerance>(const std::string&)>& tolerance_of,
    const std::function<bool(const ParamTensors&)>& update_matches = {});

}  // namespace touchstone::diff
