// The attention of a run that passed a 0/1 (or boolean) mask where an additive one was expected, for
// the attention_mask_added hypothesis (hypotheses.cpp): Hugging Face transformers adds a 4-D
// attention_mask to the scores as given, so a mask holding 1 where query i may see key j and 0
// elsewhere masks nothing and raises the allowed scores by 1:
//   P = softmax over ALL keys j of the window of (q_i k_j^T * scale + allowed(i, j)),
// allowed(i, j) = 1 when j <= i and (with document masking) j is in i's document, else 0.
// Everything else is the FP64 CPU reference backend: only its softmax is replaced. The backward is the
// reference's, from the saved P (the added constant has no gradient; the softmax backward sums over
// every key of a row).
#pragma once

#include "kernels/cpu/cpu_backend.h"

namespace touchstone::diff {

class AddedMaskBackend : public CpuBackend {
 public:
  AddedMaskBackend() : CpuBackend(BackendOptions{}) {}  // FP64
  std::string name() const override { return "cpu (0/1 attention mask added to the scores)"; }

 protected:
  // Row softmax of scores[T,T] + allowed, in place, over every key (every entry of a row nonzero).
  void attention_softmax(double* scores, const int32_t* document_ids, bool document_masking,
                         int64_t seq) override;
};

}  // namespace touchstone::diff
