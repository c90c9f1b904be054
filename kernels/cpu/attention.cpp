// CPU document-masked causal attention with grouped KV heads: forward and backward side by side.
//
// Per (window b, query head h, its KV head g):  S = Q_h K_g^T * scale  [T,T]
//   P = masked row softmax of S (a masked entry is exactly 0)        [T,T], kept for backward
//   P' = P * M with the attention dropout mask M (0 or 1/(1-p))       [T,T], P' = P without dropout
//   O_h = P' V_g                                                     [T,D], written into out[N, NH*D]
// In FP32 and BF16 modes the scores, the softmax, the dropout multiply and their backward are FP32; as
// in flash attention, the BF16 mode feeds P' and dS to the following GEMMs in BF16, and stores O, dQ,
// dK, dV in BF16.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"

namespace touchstone {

namespace {

using cpu::Store;

cpu::RoundTo scores_format(Precision p) {
  return p == Precision::kFp64 ? cpu::RoundTo::kNone : cpu::RoundTo::kFp32;
}

// Row-wise softmax of scores[T,T] in place, over the keys query i may attend to.
template <typename T>
void masked_softmax(double* scores, const int32_t* document_ids, bool document_masking, int64_t seq) {
  std::vector<T> e(static_cast<size_t>(seq));  // one row of exp(s - max)
  for (int64_t i = 0; i < seq; ++i) {
    double* row = scores + i * seq;
    auto visible = [&](int64_t j) {
      return j <= i && (!document_masking || document_ids[j] == document_ids[i]);
    };
    T row_max = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j <= i; ++j) {
      if (visible(j) && static_cast<T>(row[j]) > row_max) row_max = static_cast<T>(row[j]);
    }
    T sum = 0;
    for (int64_t j = 0; j < seq; ++j) {
      e[static_cast<size_t>(j)] = visible(j) ? std::exp(static_cast<T>(row[j]) - row_max) : T(0);
      sum += e[static_cast<size_t>(j)];
    }
    // Query i always sees itself (j = i), so sum >= 1.
    for (int64_t j = 0; j < seq; ++j) row[j] = static_cast<double>(e[static_cast<size_t>(j)] / sum);
  }
}

// Softmax backward in place: dS = P * (dP - sum_j P dP), summed over every key of the row, so that it
// holds for any saved P; masked entries have P = +0, whose products only add signed zeros to the sum (the
// same bits as summing j <= i alone), and dS = 0 there.
template <typename T>
void softmax_backward(const double* p, double* ds, int64_t seq) {
  for (int64_t i = 0; i < seq; ++i) {
    T dot = 0;
    for (int64_t j = 0; j < seq; ++j) dot += static_cast<T>(p[i * seq + j]) * static_cast<T>(ds[i * seq + j]);
    for (int64_t j = 0; j < seq; ++j) {
      ds[i * seq + j] =
          static_cast<double>(static_cast<T>(p[i * seq + j]) * (static_cast<T>(ds[i * seq + j]) - dot));
    }
  }
}

// out[T,T] = m[T,T] * keep_scale[T,T] in T: P' from P in forward, dP from dP' in backward.
template <typename T>
void multiply_mask(const double* m, const double* keep_scale, int64_t n, double* out) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<double>(static_cast<T>(m[i]) * static_cast<T>(keep_scale[i]));
  }
}

void apply_mask(Precision p, const double* m, const double* keep_scale, int64_t n, double* out) {
  if (p == Precision::kFp64) {
    multiply_mask<double>(m, keep_scale, n, out);
  } else {
    multiply_mask<float>(m, keep_scale, n, out);
  }
}

// The copy of P' (or dS) a BF16 GEMM reads; the FP32 values themselves otherwise.
const double* gemm_input(const double* m, int64_t n, Precision p, std::vector<double>& scratch) {
  if (p != Precision::kBf16) return m;
  scratch.assign(m, m + n);
  for (double& v : scratch) v = round_to_bf16(v);
  return scratch.data();
}

}  // namespace

void CpuBackend::attention_softmax(double* scores, const int32_t* document_ids, bool document_masking,
                                   int64_t seq) {
  if (precision() == Precision::kFp64) {
    masked_softmax<double>(scores, document_ids, document_masking, seq);
  } else {
    masked_softmax<float>(scores, document_ids, document_masking, seq);
  }
}

void CpuBackend::attention_forward(const double* q, const double* k, const double* v,
                                   const int32_t* document_ids, bool document_masking,
                                   const double* keep_scale, const AttentionShape& s, double* out,
                                   double* probs) {
  const int64_t T = s.seq, D = s.head_dim, queries_per_group = s.num_heads / s.num_kv_heads;
  const int64_t out_width = s.num_heads * D;
  std::vector<double> scratch;
  std::vector<double> dropped(keep_scale ? static_cast<size_t>(T * T) : 0);  // [T,T] P' of one head
  for (int64_t b = 0; b < s.windows; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t g = h / queries_per_group;
      const double* qh = q + (b * s.num_heads + h) * T * D;     // [T,D]
      const double* kg = k + (b * s.num_kv_heads + g) * T * D;  // [T,D]
      const double* vg = v + (b * s.num_kv_heads + g) * T * D;  // [T,D]
      double* p = probs + (b * s.num_heads + h) * T * T;        // [T,T]
      cpu::gemm(precision(), scores_format(precision()), false, true, T, T, D, s.scale(), qh, D, kg, D,
                Store::kOverwrite, p, T);
      attention_softmax(p, document_ids + b * T, document_masking, T);
      const double* p_used = p;  // P', what multiplies V
      if (keep_scale) {
        apply_mask(precision(), p, keep_scale + (b * s.num_heads + h) * T * T, T * T, dropped.data());
        p_used = dropped.data();
      }
      double* oh = out + b * T * out_width + h * D;  // [T,D] with row stride NH*D
      cpu::gemm(precision(), cpu::activation_format(precision()), false, false, T, D, T, 1.0,
                gemm_input(p_used, T * T, precision(), scratch), T, vg, D, Store::kOverwrite, oh, out_width);
    }
  }
}

void CpuBackend::attention_backward(const double* dout, const double* q, const double* k, const double* v,
                                    const double* probs, const double* keep_scale, const AttentionShape& s,
                                    double* dq, double* dk, double* dv) {
  const int64_t T = s.seq, D = s.head_dim, queries_per_group = s.num_heads / s.num_kv_heads;
  const int64_t out_width = s.num_heads * D;
  const int64_t kv_elements = s.windows * s.num_kv_heads * T * D;
  for (int64_t i = 0; i < kv_elements; ++i) dk[i] = dv[i] = 0.0;  // summed over the heads of a group
  const cpu::RoundTo accumulate = scores_format(precision());     // FP32 unless FP64, then stored once
  std::vector<double> dscores(static_cast<size_t>(T * T));        // [T,T]
  std::vector<double> dropped(keep_scale ? static_cast<size_t>(T * T) : 0);  // [T,T] P' of one head
  std::vector<double> scratch;
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
      const double* mask = keep_scale ? keep_scale + (b * s.num_heads + h) * T * T : nullptr;
      const double* p_used = p;  // P', what multiplied V
      if (mask) {
        apply_mask(precision(), p, mask, T * T, dropped.data());
        p_used = dropped.data();
      }
      // dV_g += P'^T dO_h;  dP' = dO_h V_g^T;  dP = dP' * M (the dropout's backward)
      cpu::gemm(precision(), accumulate, true, false, T, D, T, 1.0,
                gemm_input(p_used, T * T, precision(), scratch), T, doh, out_width, Store::kAccumulate, dvg,
                D);
      double* ds = dscores.data();
      cpu::gemm(precision(), scores_format(precision()), false, true, T, T, D, 1.0, doh, out_width, vg, D,
                Store::kOverwrite, ds, T);
      if (mask) apply_mask(precision(), ds, mask, T * T, ds);
      if (precision() == Precision::kFp64) {
        softmax_backward<double>(p, ds, T);
      } else {
        softmax_backward<float>(p, ds, T);
      }
      // dQ_h = dS K_g * scale;  dK_g += dS^T Q_h * scale
      const double* ds_in = gemm_input(ds, T * T, precision(), scratch);
      cpu::gemm(precision(), cpu::activation_format(precision()), false, false, T, D, T, s.scale(), ds_in, T,
                kg, D, Store::kOverwrite, dqh, D);
      cpu::gemm(precision(), accumulate, true, false, T, D, T, s.scale(), ds_in, T, qh, D, Store::kAccumulate,
                dkg, D);
    }
  }
  round(TensorRole::kActivation, dk, kv_elements);
  round(TensorRole::kActivation, dv, kv_elements);
}

}  // namespace touchstone
