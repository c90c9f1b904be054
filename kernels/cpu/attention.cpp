// CPU document-masked causal attention with grouped KV heads: forward and backward side by side.
//
// Per (window b, query head h, its KV head g):  S = Q_h K_g^T * scale  [T,T]
//   P = masked row softmax of S (a masked entry is exactly 0)        [T,T], kept for backward
//   O_h = P V_g                                                      [T,D], written into out[N, NH*D]
#include <cblas.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace touchstone {

namespace {

int blas_int(int64_t value) { return static_cast<int>(value); }

// Row-wise softmax of scores[T,T] in place, over the keys query i may attend to.
void masked_softmax(double* scores, const int32_t* document_ids, bool document_masking, int64_t seq) {
  for (int64_t i = 0; i < seq; ++i) {
    double* row = scores + i * seq;
    auto visible = [&](int64_t j) { return j <= i && (!document_masking || document_ids[j] == document_ids[i]); };
    double row_max = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= i; ++j) {
      if (visible(j) && row[j] > row_max) row_max = row[j];
    }
    double sum = 0.0;
    for (int64_t j = 0; j < seq; ++j) {
      row[j] = visible(j) ? std::exp(row[j] - row_max) : 0.0;
      sum += row[j];
    }
    // Query i always sees itself (j = i), so sum >= 1.
    for (int64_t j = 0; j <= i; ++j) row[j] /= sum;
  }
}

}  // namespace

void CpuBackend::attention_forward(const double* q, const double* k, const double* v, const int32_t* document_ids,
                                   bool document_masking, const AttentionShape& s, double* out, double* probs) {
  const int64_t T = s.seq, D = s.head_dim, queries_per_group = s.num_heads / s.num_kv_heads;
  const int64_t out_width = s.num_heads * D;
  for (int64_t b = 0; b < s.windows; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t g = h / queries_per_group;
      const double* qh = q + (b * s.num_heads + h) * T * D;  // [T,D]
      const double* kg = k + (b * s.num_kv_heads + g) * T * D;  // [T,D]
      const double* vg = v + (b * s.num_kv_heads + g) * T * D;  // [T,D]
      double* p = probs + (b * s.num_heads + h) * T * T;        // [T,T]
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(T), blas_int(T), blas_int(D), s.scale(), qh,
                  blas_int(D), kg, blas_int(D), 0.0, p, blas_int(T));
      masked_softmax(p, document_ids + b * T, document_masking, T);
      double* oh = out + b * T * out_width + h * D;  // [T,D] with row stride NH*D
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(T), blas_int(D), blas_int(T), 1.0, p,
                  blas_int(T), vg, blas_int(D), 0.0, oh, blas_int(out_width));
    }
  }
}

void CpuBackend::attention_backward(const double* dout, const double* q, const double* k, const double* v,
                                    const double* probs, const AttentionShape& s, double* dq, double* dk,
                                    double* dv) {
  const int64_t T = s.seq, D = s.head_dim, queries_per_group = s.num_heads / s.num_kv_heads;
  const int64_t out_width = s.num_heads * D;
  const int64_t kv_elements = s.windows * s.num_kv_heads * T * D;
  for (int64_t i = 0; i < kv_elements; ++i) dk[i] = dv[i] = 0.0;  // summed over the heads of a group
  std::vector<double> dscores(static_cast<size_t>(T * T));          // [T,T]
  for (int64_t b = 0; b < s.windows; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t g = h / queries_per_group;
      const double* qh = q + (b * s.num_heads + h) * T * D;
      const double* kg = k + (b * s.num_kv_heads + g) * T * D;
      const double* vg = v + (b * s.num_kv_heads + g) * T * D;
      const double* p = probs + (b * s.num_heads + h) * T * T;
      const double* doh = dout + b * T * out_width + h * D;  // [T,D] with row stride NH*D
      double* dqh = dq + (b * s.num_heads + h) * T * D;
      double* dkg = dk + (b * s.num_kv_heads + g) * T * D;
      double* dvg = dv + (b * s.num_kv_heads + g) * T * D;
      // dV_g += P^T dO_h;  dP = dO_h V_g^T
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(T), blas_int(D), blas_int(T), 1.0, p,
                  blas_int(T), doh, blas_int(out_width), 1.0, dvg, blas_int(D));
      double* ds = dscores.data();
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(T), blas_int(T), blas_int(D), 1.0, doh,
                  blas_int(out_width), vg, blas_int(D), 0.0, ds, blas_int(T));
      // Softmax backward: dS = P * (dP - sum_j P dP); masked entries have P = 0, so dS = 0 there.
      for (int64_t i = 0; i < T; ++i) {
        double dot = 0.0;
        for (int64_t j = 0; j <= i; ++j) dot += p[i * T + j] * ds[i * T + j];
        for (int64_t j = 0; j < T; ++j) ds[i * T + j] = p[i * T + j] * (ds[i * T + j] - dot);
      }
      // dQ_h = dS K_g * scale;  dK_g += dS^T Q_h * scale
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(T), blas_int(D), blas_int(T), s.scale(), ds,
                  blas_int(T), kg, blas_int(D), 0.0, dqh, blas_int(D));
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(T), blas_int(D), blas_int(T), s.scale(), ds,
                  blas_int(T), qh, blas_int(D), 1.0, dkg, blas_int(D));
    }
  }
}

}  // namespace touchstone
