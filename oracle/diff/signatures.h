// Error signatures: what kind of mistake a failing diff looks like. Each check looks at the step of the
// first failure and says something only when its signature matches:
//   recomputed (hypotheses.h)  the candidate equals the golden step evaluated under another rule: the
//                              other loss normalisation, document mask missing or applied, position
//                              ids not reset, linear_qkv read in [q; k; v] order, a 0/1 attention
//                              mask added to the scores (attention_mask_added), the targets shifted
//                              once more (targets_shifted_twice);
//   fp32_in_fp64               FP64 file; every gradient off by Touchstone's FP32 mode's error, within
//                              a factor 100;
//   token_count                the loss-token counts differ, explained by padding, EOS or document-
//                              boundary targets where the count difference matches one of them;
//   qkv_layout                 a linear_qkv tensor equals the golden one with its rows in [q; k; v] order;
//   tp_shard                   the failing elements of each failing sharded tensor lie in one tensor-
//                              parallel shard and cover at least half of it (sharding.h's layout, tp
//                              from --tp or 2, 4, 8);
//   gradient_scale             every gradient equals the golden one times one factor (least squares
//                              over all gradients, then every scaled tensor must pass);
//   tied_embedding_reduced_twice  only the tied embedding's gradient fails, and it is 2^n x golden (its
//                              all-reduce over the first and last stage ran n + 1 times);
//   optimizer                  the updated parameters match AdamW with one rule changed (no bias
//                              correction, weight decay on every tensor, clipping after the moments, the
//                              learning rate of the step before or after), applied to the candidate's
//                              own gradients (optimizer_check.h);
//   one_layer                  only tensors of one decoder layer fail, and for updated parameters only
//                              where that layer's gradients do not pass.
#pragma once

#include <string>
#include <vector>

#include "oracle/diff/diff.h"
#include "oracle/golden/golden_reader.h"

namespace touchstone::diff {

// Where the per-tensor signatures look: the first group of the step (initial parameters, gradients,
// updated parameters, moments) with a failing tensor.
struct Group {
  std::vector<const Entry*> compared, failing;
};

struct SignatureOptions {
  std::vector<int> tp_sizes;  // empty: 2, 4 and 8
  bool recompute = true;
};

// `result` holds the compared entries (first_failure set); notes about skipped checks are added to it.
// `judge` gives each entry's reference (re-anchored, optimizer check or trajectory).
std::vector<Verdict> find_signatures(const GoldenReader& golden, const ToleranceModel& tolerances,
                                     const TensorMap& candidate, Judge& judge, DiffResult& result,
                                     const SignatureOptions& options);

}  // namespace touchstone::diff
