// The attention of a run that passed a 0/1 (or boolean) mask where an additive one was expected, for
// the attention_mask_added hypothesis (hypotheses.cpp): Hugging Face transformers adds a 4-D
// attention_mask to the scores as given, so a mask holding 1 where query i may see key j and 0
// elsewhere masks nothing and raises the allowed scores by 1:
//   P = softmax over ALL keys j of the window of (q_i k_j^T * scale + allowed(i, j)),
// allowed(i, j) = 1 when j <= i and (with document masking) j is in i's document, else 0.
// Everything else is the FP64 CPU reference backend: only the mask form of its attention changes
// (CpuBackend::MaskForm), forward and backward alike (the added constant has no gradient).
#pragma once

#include "kernels/cpu/cpu_backend.h"

namespace touchstone::diff {

class AddedMaskBackend : public CpuBackend {
 public:
  AddedMaskBackend() : CpuBackend(BackendOptions{}) {}  // FP64
  std::string name() const override { return "cpu (0/1 attention mask added to the scores)"; }

 protected:
  MaskForm mask_form() const override { return MaskForm::kAllowedAdded; }
};

}  // namespace touchstone::diff
