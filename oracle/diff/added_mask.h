// The attention of a run that passed a 0/1 (or boolean) mask where an additive one was expected, for
// the attention_mask_added hypothesis (hypotheses.cpp): Hugging Face transformers adds a 4-D
// attention_mask to the scores as given, so a mask holding 1 where query i may see key j and 0
// elsewhere masks nothing and raises the allowed scores by 1:
//   P = softmax over ALL keys j of the window of (q_i k_j^T * scale + allowed(i, j)),
// allowed(i, j) = 1 when j <= i and (with document masking) j is in i's document, else 0.
// Everything else is the FP64 CPU reference backend.
#pragma once

#include <memory>

#include "kernels/cpu/cpu_backend.h"

namespace touchstone::diff {

class AddedMaskBackend : public CpuBackend {
 public:
  AddedMaskBackend() : CpuBackend(BackendOptions{}) {}  // FP64
  std::string name() const override { return "cpu (0/1 attention mask added to the scores)"; }

  // As Backend::attention_forward, with P as above (every entry of a row nonzero); probs saved.
  void attention_forward(const double* q, const double* k, const double* v, const int32_t* document_ids,
                         bool document_masking, const double* keep_scale, const AttentionShape& shape,
                         double* out, double* probs) override;
  // The backward of that forward from the saved probs. The added constant has no gradient, so it is
  // the plain softmax backward, dS = P * (dP - sum_j P dP), but summed over every key of the row: the
  // CPU reference's backward sums over j <= i only (its P is 0 beyond the diagonal).
  void attention_backward(const double* dout, const double* q, const double* k, const double* v,
                          const double* probs, const double* keep_scale, const AttentionShape& shape,
                          double* dq, double* dk, double* dv) override;
};

}  // namespace touchstone::diff
