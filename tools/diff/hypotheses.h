// Signatures found by recomputation: the golden step's loss and gradients evaluated (in FP64, with
// oracle/train_step.h's evaluate_objective on the whole model) under rules a production run commonly
// gets wrong, each compared with the candidate using the golden tolerances. A candidate that passes
// against one of them computed that rule instead of the golden one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/diff/diff.h"
#include "tools/diff/golden.h"

namespace touchstone::diff {

// Verdicts for the rules the candidate's loss and gradients of `step` match. Needs the loss or a
// gradient in the candidate; otherwise returns nothing.
std::vector<Verdict> match_recomputed_rules(const Golden& golden, const ToleranceModel& tolerances,
                                            const TensorMap& candidate, int64_t step);

}  // namespace touchstone::diff
