// Dense attention in FP64: the O(T^2) formulation the CPU backend used before it worked in tiles, kept
// as the reference the tiled kernels (kernels/cpu/attention.cpp) are tested against. It materialises
// every [T,T] matrix of one (window, query head) and the whole dropout mask, in plain loops, so each
// line can be checked by eye against the formulas:
//   S = Q K^T * scale;  P = row softmax of S over the visible keys (a masked entry is exactly 0)
//   P' = P * M, M the attention dropout mask (kernels/dropout_mask.h), all ones without dropout
//   O = P' V;  lse_i = log sum_j visible exp(S_ij)
// backward:
//   dV = P'^T dO;  dP = (dO V^T) * M;  dS = P * (dP - rowsum(P * dP))
//   dQ = dS K * scale;  dK = dS^T Q * scale
// Query head h reads KV head h / (NH / NKV); dK and dV are summed over the heads of a group.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/rounding.h"
#include "kernels/dropout_mask.h"

namespace touchstone::dense {

// Query i sees key j: causal, and within one document when masking (attention_forward's rule).
inline bool visible(const int32_t* document_ids, bool document_masking, int64_t i, int64_t j) {
  return j <= i && (!document_masking || document_ids[j] == document_ids[i]);
}

struct Forward {
  std::vector<double> out;    // [b*T, NH*D]
  std::vector<double> lse;    // [b,NH,T]
  std::vector<double> probs;  // [b,NH,T,T] P, before dropout
  std::vector<double> keep;   // [b,NH,T,T] M: 0 or 1/(1-p); all ones without dropout
};

struct Backward {
  std::vector<double> dq;  // [b,NH,T,D]
  std::vector<double> dk;  // [b,NKV,T,D]
  std::vector<double> dv;  // [b,NKV,T,D]
};

// The whole mask M[b,NH,T,T] from the one formula of kernels/dropout_mask.h, in FP64.
inline std::vector<double> dropout_mask(const AttentionDropout& dropout, const AttentionShape& s) {
  const int64_t T = s.seq;
  std::vector<double> keep(static_cast<size_t>(s.windows * s.num_heads * T * T), 1.0);
  if (!dropout.active()) return keep;
  const double kept = dropout_kept_value(dropout.site.probability, cpu::Rounding{Precision::kFp64});
  for (int64_t b = 0; b < s.windows; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          keep[static_cast<size_t>(((b * s.num_heads + h) * T + i) * T + j)] =
              dropout_keep_scale(dropout.site, dropout.site.sample_indices[b],
                                 attention_dropout_element(dropout.first_head + h, i, j, T), kept);
        }
      }
    }
  }
  return keep;
}

inline Forward attention_forward(const std::vector<double>& q, const std::vector<double>& k,
                                 const std::vector<double>& v, const std::vector<int32_t>& document_ids,
                                 bool document_masking, const AttentionDropout& dropout,
                                 const AttentionShape& s) {
  const int64_t T = s.seq, D = s.head_dim, group = s.num_heads / s.num_kv_heads, width = s.num_heads * D;
  const double scale = s.scale();
  Forward f;
  f.out.assign(static_cast<size_t>(s.windows * T * width), 0.0);
  f.lse.assign(static_cast<size_t>(s.windows * s.num_heads * T), 0.0);
  f.probs.assign(static_cast<size_t>(s.windows * s.num_heads * T * T), 0.0);
  f.keep = dropout_mask(dropout, s);
  std::vector<double> scores(static_cast<size_t>(T));  // one row of S
  for (int64_t b = 0; b < s.windows; ++b) {
    const int32_t* docs = document_ids.data() + b * T;
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t g = h / group;
      const double* qh = q.data() + (b * s.num_heads + h) * T * D;
      const double* kg = k.data() + (b * s.num_kv_heads + g) * T * D;
      const double* vg = v.data() + (b * s.num_kv_heads + g) * T * D;
      double* p = f.probs.data() + (b * s.num_heads + h) * T * T;
      const double* m = f.keep.data() + (b * s.num_heads + h) * T * T;
      for (int64_t i = 0; i < T; ++i) {
        double row_max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < T; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += qh[i * D + d] * kg[j * D + d];
          scores[static_cast<size_t>(j)] = dot * scale;
          if (visible(docs, document_masking, i, j)) row_max = std::max(row_max, dot * scale);
        }
        double sum = 0.0;  // >= 1: query i sees itself
        for (int64_t j = 0; j < T; ++j) {
          p[i * T + j] = visible(docs, document_masking, i, j)
                             ? std::exp(scores[static_cast<size_t>(j)] - row_max)
                             : 0.0;
          sum += p[i * T + j];
        }
        for (int64_t j = 0; j < T; ++j) p[i * T + j] /= sum;
        f.lse[static_cast<size_t>((b * s.num_heads + h) * T + i)] = row_max + std::log(sum);
        double* o = f.out.data() + (b * T + i) * width + h * D;
        for (int64_t j = 0; j < T; ++j) {
          const double pj = p[i * T + j] * m[i * T + j];  // P'
          for (int64_t d = 0; d < D; ++d) o[d] += pj * vg[j * D + d];
        }
      }
    }
  }
  return f;
}

inline Backward attention_backward(const std::vector<double>& dout, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const Forward& f, const AttentionShape& s) {
  const int64_t T = s.seq, D = s.head_dim, group = s.num_heads / s.num_kv_heads, width = s.num_heads * D;
  const double scale = s.scale();
  Backward r;
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  std::vector<double> ds(static_cast<size_t>(T * T));  // dP, then dS, of one head
  for (int64_t b = 0; b < s.windows; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t g = h / group;
      const double* qh = q.data() + (b * s.num_heads + h) * T * D;
      const double* kg = k.data() + (b * s.num_kv_heads + g) * T * D;
      const double* vg = v.data() + (b * s.num_kv_heads + g) * T * D;
      const double* p = f.probs.data() + (b * s.num_heads + h) * T * T;
      const double* m = f.keep.data() + (b * s.num_heads + h) * T * T;
      const double* doh = dout.data() + b * T * width + h * D;  // row stride NH*D
      double* dqh = r.dq.data() + (b * s.num_heads + h) * T * D;
      double* dkg = r.dk.data() + (b * s.num_kv_heads + g) * T * D;
      double* dvg = r.dv.data() + (b * s.num_kv_heads + g) * T * D;
      for (int64_t i = 0; i < T; ++i) {
        // dV += P'^T dO;  dP = (dO V^T) * M
        for (int64_t j = 0; j < T; ++j) {
          const double pj = p[i * T + j] * m[i * T + j];
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            dvg[j * D + d] += pj * doh[i * width + d];
            dot += doh[i * width + d] * vg[j * D + d];
          }
          ds[static_cast<size_t>(i * T + j)] = dot * m[i * T + j];
        }
        // dS = P * (dP - rowsum(P * dP))
        double row = 0.0;
        for (int64_t j = 0; j < T; ++j) row += p[i * T + j] * ds[static_cast<size_t>(i * T + j)];
        for (int64_t j = 0; j < T; ++j) {
          double& e = ds[static_cast<size_t>(i * T + j)];
          e = p[i * T + j] * (e - row);
        }
        // dQ = dS K * scale;  dK += dS^T Q * scale
        for (int64_t j = 0; j < T; ++j) {
          const double e = ds[static_cast<size_t>(i * T + j)];
          for (int64_t d = 0; d < D; ++d) {
            dqh[i * D + d] += e * kg[j * D + d] * scale;
            dkg[j * D + d] += e * qh[i * D + d] * scale;
          }
        }
      }
    }
  }
  return r;
}

}  // namespace touchstone::dense
