// Attention with a 0/1 mask added to the scores (added_mask.h), in FP64. Per (window b, query head h,
// its KV head g):
//   S = Q_h K_g^T * scale + A      A[i, j] = 1 where the golden rule lets query i see key j, else 0
//   P = row softmax of S over all T keys (nothing masked)             kept for backward
//   P' = P * M with the attention dropout mask M, P' = P without dropout
//   O_h = P' V_g
#include "oracle/diff/added_mask.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace touchstone::diff {

namespace {

using cpu::RoundTo;
using cpu::Store;
constexpr Precision kFp64 = Precision::kFp64;

// Row softmax of scores[T,T] + A in place, over every key.
void added_mask_softmax(double* scores, const int32_t* document_ids, bool document_masking, int64_t seq) {
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

}  // namespace

void AddedMaskBackend::attention_forward(const double* q, const double* k, const double* v,
                                         const int32_t* document_ids, bool document_masking,
                                         const double* keep_scale, const AttentionShape& s, double* out,
                                         double* probs) {
  const int64_t T = s.seq, D = s.head_dim, queries_per_group = s.num_heads / s.num_kv_heads;
  const int64_t out_width = s.num_heads * D;
  std::vector<double> dropped(static_cast<size_t>(T * T));  // [T,T] P' of one head
  for (int64_t b = 0; b < s.windows; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t g = h / queries_per_group;
      const double* qh = q + (b * s.num_heads + h) * T * D;     // [T,D]
      const double* kg = k + (b * s.num_kv_heads + g) * T * D;  // [T,D]
      const double* vg = v + (b * s.num_kv_heads + g) * T * D;  // [T,D]
      double* p = probs + (b * s.num_heads + h) * T * T;        // [T,T]
      cpu::gemm(kFp64, RoundTo::kNone, false, true, T, T, D, s.scale(), qh, D, kg, D, Store::kOverwrite, p,
                T);
      added_mask_softmax(p, document_ids + b * T, document_masking, T);
      const double* p_used = p;
      if (keep_scale) {
        const double* mask = keep_scale + (b * s.num_heads + h) * T * T;
        for (int64_t e = 0; e < T * T; ++e) dropped[static_cast<size_t>(e)] = p[e] * mask[e];
        p_used = dropped.data();
      }
      double* oh = out + b * T * out_width + h * D;  // [T,D] with row stride NH*D
      cpu::gemm(kFp64, RoundTo::kNone, false, false, T, D, T, 1.0, p_used, T, vg, D, Store::kOverwrite, oh,
                out_width);
    }
  }
}

void AddedMaskBackend::attention_backward(const double* dout, const double* q, const double* k,
                                          const double* v, const double* probs, const double* keep_scale,
                                          const AttentionShape& s, double* dq, double* dk, double* dv) {
  const int64_t T = s.seq, D = s.head_dim, queries_per_group = s.num_heads / s.num_kv_heads;
  const int64_t out_width = s.num_heads * D;
  std::fill(dk, dk + s.windows * s.num_kv_heads * T * D, 0.0);  // summed over the heads of a group
  std::fill(dv, dv + s.windows * s.num_kv_heads * T * D, 0.0);
  std::vector<double> ds(static_cast<size_t>(T * T)), dropped(static_cast<size_t>(T * T));
  for (int64_t b = 0; b < s.windows; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t g = h / queries_per_group;
      const double* qh = q + (b * s.num_heads + h) * T * D;
      const double* kg = k + (b * s.num_kv_heads + g) * T * D;
      const double* vg = v + (b * s.num_kv_heads + g) * T * D;
      const double* p = probs + (b * s.num_heads + h) * T * T;
      const double* doh = dout + b * T * out_width + h * D;  // [T,D] with row stride NH*D
      const double* mask = keep_scale ? keep_scale + (b * s.num_heads + h) * T * T : nullptr;
      const double* p_used = p;
      if (mask) {
        for (int64_t e = 0; e < T * T; ++e) dropped[static_cast<size_t>(e)] = p[e] * mask[e];
        p_used = dropped.data();
      }
      // dV_g += P'^T dO_h;  dP' = dO_h V_g^T;  dP = dP' * M
      cpu::gemm(kFp64, RoundTo::kNone, true, false, T, D, T, 1.0, p_used, T, doh, out_width,
                Store::kAccumulate, dv + (b * s.num_kv_heads + g) * T * D, D);
      cpu::gemm(kFp64, RoundTo::kNone, false, true, T, T, D, 1.0, doh, out_width, vg, D, Store::kOverwrite,
                ds.data(), T);
      if (mask) {
        for (int64_t e = 0; e < T * T; ++e) ds[static_cast<size_t>(e)] *= mask[e];
      }
      // dS = P * (dP - sum_j P dP), every key of the row
      for (int64_t i = 0; i < T; ++i) {
        double dot = 0;
        for (int64_t j = 0; j < T; ++j) dot += p[i * T + j] * ds[static_cast<size_t>(i * T + j)];
        for (int64_t j = 0; j < T; ++j) {
          ds[static_cast<size_t>(i * T + j)] = p[i * T + j] * (ds[static_cast<size_t>(i * T + j)] - dot);
        }
      }
      // dQ_h = dS K_g * scale;  dK_g += dS^T Q_h * scale
      cpu::gemm(kFp64, RoundTo::kNone, false, false, T, D, T, s.scale(), ds.data(), T, kg, D,
                Store::kOverwrite, dq + (b * s.num_heads + h) * T * D, D);
      cpu::gemm(kFp64, RoundTo::kNone, true, false, T, D, T, s.scale(), ds.data(), T, qh, D,
                Store::kAccumulate, dk + (b * s.num_kv_heads + g) * T * D, D);
    }
  }
}

}  // namespace touchstone::diff
