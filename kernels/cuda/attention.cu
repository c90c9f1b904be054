// CUDA document-masked causal attention with grouped KV heads, forward and backward; the device twin
// of kernels/cpu/attention.cpp, with the same formulas and the same rounding points per precision.
//
// Hand-written row kernels, no cuBLAS: each block of kBlockThreads threads owns one row of the
// [T,T] attention matrix of one (window, head), so every reduction runs in a fixed order (launch.h)
// and there are no atomics:
//   forward           block per query row (b, h, i): scores, softmax, P' = P * M, O_i = P' V
//   backward, dQ      block per query row (b, h, i): dP = (dO_i V^T) * M, dS = P (dP - P.dP), dQ_i
//   backward, dK, dV  block per key row (b, g, j): sums over the group's heads and the query rows
// Compute type T: double in FP64 mode, float otherwise (the CPU's masked_softmax<T> and SGEMMs).
#include <cmath>

#include "kernels/cuda/cuda_backend.cuh"

namespace touchstone {

namespace {

// Where one row of the grid lives: row = (b * heads + head) * T + position, heads = NH or NKV.
struct RowIndex {
  int64_t b, head, position, head_row;  // head_row = b * heads + head
};

__device__ RowIndex row_index(int64_t row, int64_t heads, int64_t seq) {
  const int64_t head_row = row / seq;
  return RowIndex{head_row / heads, head_row % heads, row % seq, head_row};
}

__device__ inline float exp_of(float x) { return expf(x); }
__device__ inline double exp_of(double x) { return exp(x); }

// a * b rounded on its own, never fused into a following add: the CPU rounds a GEMM's alpha * sum to
// FP32 before adding it to the FP32 accumulator.
__device__ inline float rounded_product(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double rounded_product(double a, double b) { return __dmul_rn(a, b); }

// The value a GEMM operand holds: in BF16 mode P' and dS enter the following products as BF16, as
// the CPU's gemm_input rounds them (FP32 -> BF16 is the same as double -> FP32 -> BF16 here: the
// value is already an FP32 one).
template <typename T>
__device__ T gemm_input(T value, bool bf16_inputs) {
  return bf16_inputs ? static_cast<T>(round_to_bf16(static_cast<double>(value))) : value;
}

// P'_ij as the P'V and P'^T dO products read it: P times the dropout mask in T, like multiply_mask.
template <typename T>
__device__ T dropped_prob(const double* probs, const double* keep_scale, int64_t at, bool bf16_inputs) {
  T p = static_cast<T>(probs[at]);
  if (keep_scale != nullptr) p = p * static_cast<T>(keep_scale[at]);
  return gemm_input(p, bf16_inputs);
}

// Inputs q[b,NH,T,D], k[b,NKV,T,D], v[b,NKV,T,D], document_ids[b*T] (null without masking),
// keep_scale[b,NH,T,T] (null: no dropout); outputs out[N, NH*D], probs[b,NH,T,T]. One block per query
// row (b, h, i); the probs row doubles as the scratch for the scores and the exponentials.
template <typename T>
__global__ void attention_forward_kernel(const double* q, const double* k, const double* v,
                                         const int32_t* document_ids, const double* keep_scale,
                                         AttentionShape shape, double scale, bool bf16_inputs,
                                         cpu::Rounding r, double* out, double* probs) {
  const int64_t seq = shape.seq, dim = shape.head_dim;
  const RowIndex at = row_index(blockIdx.x, shape.num_heads, seq);
  const int64_t i = at.position, h = at.head;
  const int64_t g = h / (shape.num_heads / shape.num_kv_heads);
  const double* q_i = q + (at.head_row * seq + i) * dim;                                     // [D]
  const double* k_g = k + (at.b * shape.num_kv_heads + g) * seq * dim;                       // [T,D]
  const double* v_g = v + (at.b * shape.num_kv_heads + g) * seq * dim;                       // [T,D]
  double* p_i = probs + (at.head_row * seq + i) * seq;                                       // [T]
  const double* keep_i = keep_scale ? keep_scale + (at.head_row * seq + i) * seq : nullptr;  // [T]
  const int32_t* docs = document_ids ? document_ids + at.b * seq : nullptr;                  // [T]
  auto visible = [&](int64_t j) { return j <= i && (docs == nullptr || docs[j] == docs[i]); };

  // Scores: the GEMM's alpha multiplies the finished dot product (in FP32 outside FP64), and the
  // product is stored in T, so s_j is exactly the CPU's stored score format.
  T local_max = static_cast<T>(-INFINITY);
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
    double stored = 0.0;  // a masked entry is exactly 0 in probs
    if (visible(j)) {
      T dot = 0;
      for (int64_t d = 0; d < dim; ++d) dot += static_cast<T>(q_i[d]) * static_cast<T>(k_g[j * dim + d]);
      const T score = static_cast<T>(scale) * dot;
      local_max = max(local_max, score);
      stored = static_cast<double>(score);
    }
    p_i[j] = stored;
  }
  const T row_max = cuda::block_max(local_max);

  T local_sum = 0;
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
    if (!visible(j)) continue;
    const T e = exp_of(static_cast<T>(p_i[j]) - row_max);
    p_i[j] = static_cast<double>(e);
    local_sum += e;
  }
  const T sum = cuda::block_sum(local_sum);  // >= 1: query i always sees itself
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
    if (visible(j)) p_i[j] = static_cast<double>(static_cast<T>(p_i[j]) / sum);
  }
  __syncthreads();  // the whole probs row is read by every thread below

  // O_i[d] = sum_j P'_ij V_j[d], ascending j; keys past i have P = 0 and are skipped.
  double* o_i = out + (at.b * seq + i) * shape.num_heads * dim + h * dim;  // [D] of out's row b*T+i
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    T acc = 0;
    for (int64_t j = 0; j <= i; ++j) {
      acc += dropped_prob<T>(p_i, keep_i, j, bf16_inputs) * static_cast<T>(v_g[j * dim + d]);
    }
    o_i[d] = r.activation(static_cast<double>(acc));
  }
}

// Inputs dout[N, NH*D], k, v [b,NKV,T,D], probs and keep_scale [b,NH,T,T]; outputs dq[b,NH,T,D] and
// dscores[b,NH,T,T], dS as the dK product reads it (BF16 in BF16 mode; entries j > i are not written,
// they are never read). One block per query row (b, h, i).
template <typename T>
__global__ void attention_dq_kernel(const double* dout, const double* k, const double* v, const double* probs,
                                    const double* keep_scale, AttentionShape shape, double scale,
                                    bool bf16_inputs, cpu::Rounding r, double* dq, double* dscores) {
  const int64_t seq = shape.seq, dim = shape.head_dim;
  const RowIndex at = row_index(blockIdx.x, shape.num_heads, seq);
  const int64_t i = at.position, h = at.head;
  const int64_t g = h / (shape.num_heads / shape.num_kv_heads);
  const double* do_i = dout + (at.b * seq + i) * shape.num_heads * dim + h * dim;  // [D] of dout's row
  const double* k_g = k + (at.b * shape.num_kv_heads + g) * seq * dim;             // [T,D]
  const double* v_g = v + (at.b * shape.num_kv_heads + g) * seq * dim;             // [T,D]
  const double* p_i = probs + (at.head_row * seq + i) * seq;                       // [T]
  const double* keep_i = keep_scale ? keep_scale + (at.head_row * seq + i) * seq : nullptr;  // [T]
  double* ds_i = dscores + (at.head_row * seq + i) * seq;                                    // [T]

  // dP_ij = (dO_i . V_j) * M_ij, each product in T as the CPU's stored GEMM result and multiply_mask.
  // Only j <= i matter: P = 0 beyond, so dS = 0 there.
  T local = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    T dp = 0;
    for (int64_t d = 0; d < dim; ++d) dp += static_cast<T>(do_i[d]) * static_cast<T>(v_g[j * dim + d]);
    if (keep_i != nullptr) dp = dp * static_cast<T>(keep_i[j]);
    ds_i[j] = static_cast<double>(dp);
    local += static_cast<T>(p_i[j]) * dp;
  }
  const T p_dot_dp = cuda::block_sum(local);
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const T ds = static_cast<T>(p_i[j]) * (static_cast<T>(ds_i[j]) - p_dot_dp);
    ds_i[j] = static_cast<double>(gemm_input(ds, bf16_inputs));
  }
  __syncthreads();  // the whole dS row is read by every thread below

  // dQ_i[d] = scale * sum_j dS_ij K_j[d], ascending j; alpha after the sum as in the GEMM.
  double* dq_i = dq + (at.head_row * seq + i) * dim;  // [D]
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    T acc = 0;
    for (int64_t j = 0; j <= i; ++j) acc += static_cast<T>(ds_i[j]) * static_cast<T>(k_g[j * dim + d]);
    dq_i[d] = r.activation(static_cast<double>(static_cast<T>(scale) * acc));
  }
}

// Inputs dout[N, NH*D], q[b,NH,T,D], probs, keep_scale and dscores [b,NH,T,T]; outputs dk, dv
// [b,NKV,T,D]. One block per key row (b, g, j); thread d sums, per head h of group g in ascending
// order, the query rows i >= j in ascending order, then adds that head's sum to the group's total in
// T, as the CPU's per-head GEMMs accumulate into FP32 (FP64) dK and dV. Stored once, as activations.
template <typename T>
__global__ void attention_dkv_kernel(const double* dout, const double* q, const double* probs,
                                     const double* keep_scale, const double* dscores, AttentionShape shape,
                                     double scale, bool bf16_inputs, cpu::Rounding r, double* dk,
                                     double* dv) {
  const int64_t seq = shape.seq, dim = shape.head_dim, heads = shape.num_heads;
  const RowIndex at = row_index(blockIdx.x, shape.num_kv_heads, seq);
  const int64_t j = at.position, g = at.head;
  const int64_t queries_per_group = heads / shape.num_kv_heads;
  const int64_t out_width = heads * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    T dk_acc = 0, dv_acc = 0;
    for (int64_t h = g * queries_per_group; h < (g + 1) * queries_per_group; ++h) {
      const int64_t head_row = at.b * heads + h;
      T dk_sum = 0, dv_sum = 0;
      for (int64_t i = j; i < seq; ++i) {
        const int64_t ij = (head_row * seq + i) * seq + j;  // element (i, j) of the head's [T,T]
        const T d_out = static_cast<T>(dout[(at.b * seq + i) * out_width + h * dim + d]);
        dk_sum += static_cast<T>(dscores[ij]) * static_cast<T>(q[(head_row * seq + i) * dim + d]);
        dv_sum += dropped_prob<T>(probs, keep_scale, ij, bf16_inputs) * d_out;
      }
      dk_acc = dk_acc + rounded_product(static_cast<T>(scale), dk_sum);
      dv_acc = dv_acc + dv_sum;
    }
    const int64_t out_at = (at.head_row * seq + j) * dim + d;
    dk[out_at] = r.activation(static_cast<double>(dk_acc));
    dv[out_at] = r.activation(static_cast<double>(dv_acc));
  }
}

}  // namespace

void CudaBackend::attention_forward(const double* q, const double* k, const double* v,
                                    const int32_t* document_ids, bool document_masking,
                                    const double* keep_scale, const AttentionShape& shape, double* out,
                                    double* probs) {
  const int64_t b = shape.windows, T = shape.seq, NH = shape.num_heads, NKV = shape.num_kv_heads;
  const int64_t D = shape.head_dim;
  const cuda::Launch launch = cuda::per_row(b * NH * T);  // one block per query row
  if (launch.blocks == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_q = s.upload(q, b * NH * T * D);                                     // [b,NH,T,D]
  const double* d_k = s.upload(k, b * NKV * T * D);                                    // [b,NKV,T,D]
  const double* d_v = s.upload(v, b * NKV * T * D);                                    // [b,NKV,T,D]
  const int32_t* d_docs = document_masking ? s.upload(document_ids, b * T) : nullptr;  // [b*T]
  const double* d_keep = s.upload(keep_scale, b * NH * T * T);                         // [b,NH,T,T]
  double* d_out = s.output<double>(b * T * NH * D);                                    // [N, NH*D]
  double* d_probs = s.output<double>(b * NH * T * T);                                  // [b,NH,T,T]
  const bool bf16_inputs = precision() == Precision::kBf16;
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(attention_forward_kernel<decltype(compute)>, launch, stream_, d_q, d_k, d_v, d_docs,
                        d_keep, shape, shape.scale(), bf16_inputs, rounding_, d_out, d_probs);
  });
  cuda::check_launch("attention_forward");
  s.download(out, d_out, b * T * NH * D);
  s.download(probs, d_probs, b * NH * T * T);
  s.finish();
}

void CudaBackend::attention_backward(const double* dout, const double* q, const double* k, const double* v,
                                     const double* probs, const double* keep_scale,
                                     const AttentionShape& shape, double* dq, double* dk, double* dv) {
  const int64_t b = shape.windows, T = shape.seq, NH = shape.num_heads, NKV = shape.num_kv_heads;
  const int64_t D = shape.head_dim;
  const cuda::Launch query_rows = cuda::per_row(b * NH * T), key_rows = cuda::per_row(b * NKV * T);
  if (query_rows.blocks == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_dout = s.upload(dout, b * T * NH * D);        // [N, NH*D]
  const double* d_q = s.upload(q, b * NH * T * D);              // [b,NH,T,D]
  const double* d_k = s.upload(k, b * NKV * T * D);             // [b,NKV,T,D]
  const double* d_v = s.upload(v, b * NKV * T * D);             // [b,NKV,T,D]
  const double* d_probs = s.upload(probs, b * NH * T * T);      // [b,NH,T,T]
  const double* d_keep = s.upload(keep_scale, b * NH * T * T);  // [b,NH,T,T]
  double* d_dq = s.output<double>(b * NH * T * D);              // [b,NH,T,D]
  double* d_dk = s.output<double>(b * NKV * T * D);             // [b,NKV,T,D]
  double* d_dv = s.output<double>(b * NKV * T * D);             // [b,NKV,T,D]
  double* d_dscores = s.output<double>(b * NH * T * T);         // [b,NH,T,T] dS, from dQ's kernel to dK's
  const bool bf16_inputs = precision() == Precision::kBf16;
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(attention_dq_kernel<decltype(compute)>, query_rows, stream_, d_dout, d_k, d_v,
                        d_probs, d_keep, shape, shape.scale(), bf16_inputs, rounding_, d_dq, d_dscores);
  });
  cuda::check_launch("attention_backward (dq)");
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(attention_dkv_kernel<decltype(compute)>, key_rows, stream_, d_dout, d_q, d_probs,
                        d_keep, d_dscores, shape, shape.scale(), bf16_inputs, rounding_, d_dk, d_dv);
  });
  cuda::check_launch("attention_backward (dk, dv)");
  s.download(dq, d_dq, b * NH * T * D);
  s.download(dk, d_dk, b * NKV * T * D);
  s.download(dv, d_dv, b * NKV * T * D);
  s.finish();
}

}  // namespace touchstone
