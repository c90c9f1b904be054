// Attention with a 0/1 mask added to the scores (added_mask.h), in FP64. Per (window b, query head h,
// its KV head g), the CPU reference computes S = Q_h K_g^T * scale and O_h = P' V_g; this softmax makes
//   P = row softmax of S + A over all T keys (nothing masked),  A[i, j] = 1 where the golden rule lets
//   query i see key j, else 0.
#include "oracle/diff/added_mask.h"

#include <algorithm>
#include <cmath>

namespace touchstone::diff {

void AddedMaskBackend::attention_softmax(double* scores, const int32_t* document_ids, bool document_masking,
                                         int64_t seq) {
  for (int64_t i = 0; i < seq; ++i) {
    double* row = scores + i * seq;
    for (int64_t j = 0; j < seq; ++j) {
      const bool allowed = j <= i && (!document_masking || document_ids[j] == document_ids[i]);
      if (allowed) row[j] += 1.0;
    }
    const double row_max = *std::max_element(row, row + seq);
    double sum = 0;
    for (int64_t j = 0; j < seq; ++j) {
      row[j] = std::exp(row[j] - row_max);
      sum += row[j];
    }
    for (int64_t j = 0; j < seq; ++j) row[j] /= sum;
  }
}

}  // namespace touchstone::diff
