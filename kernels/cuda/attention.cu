// CUDA document-masked causal attention with grouped KV heads, forward and backward in the flash
// attention form, over a block of a window (AttentionBlock: Tq query rows against Tk key rows, each
// row at its position in the window), and the merge of blocks; the device twin of
// kernels/cpu/attention.cpp, with the same formulas and the same rounding points per precision. Nothing
// [Tq,Tk] is stored: the forward keeps lse[b,NH,Tq] for the backward, which recomputes the scores and
// P = exp(S - lse) where it needs them. The whole window (Backend::attention_forward) is the block with
// positions 0..T-1 on both sides.
//
// Hand-written row kernels, no cuBLAS: each block of kBlockThreads threads owns one query row or one
// key row of one (window, head) and walks the other side in tiles of kAttentionTile rows, in the CPU's
// tile order, one thread per key (query) of the tile; every sum runs in a fixed order and there are no
// atomics:
//   forward   block per query row (b, h, i), key tiles J ascending: S, the running max m and sum l,
//             acc = acc * exp(m - m') + (P~ * M) V_J; then O_i = acc / l, lse_i = m + log l, or
//             O_i = 0, lse_i = -inf when the row sees no key of the block (l = 0)
//   Delta     thread per query row: Delta_i = dO_i . O_i (a per-call [b,NH,Tq] temporary)
//   dQ        block per query row (b, h, i), key tiles ascending: dQ_i += scale dS_IJ K_J
//   dK, dV    block per key row (b, g, j), the group's heads h ascending, then query tiles ascending:
//             dK_j += scale dS^T Q_I, dV_j += P'^T dO_I
//   merge     thread per query row and head: the log-sum-exp rule of attention_merge (attention_merge.cu)
// with P = exp(S - lse_i), dP = (dO_i . V_j) * M_ij, dS = P (dP - Delta_i), P' = P * M_ij recomputed
// per entry by the dQ and dK/dV kernels alike (entry()); out and lse given to the backward are those of
// all the blocks merged, so P is the whole softmax's. Query row i sees key row j iff key_pos_j <=
// query_pos_i and, with document masking, their document ids are equal. The dropout mask M is drawn in
// the kernels from its coordinates, the rows' positions in the window (dropout_mask.cuh), bitwise the
// CPU's.
//
// Tiles: the kernels visit only the (query tile, key tile) pairs the CPU reference's tile rule keeps
// (WindowMask::tile_needed, kernels/attention_tiles.h), taken as a table computed on the host from
// the positions and document ids; attention_tiles() counts the pairs of that same rule (WindowMask::count()
// per window and head), on the host, for every forward call. It is the work the rule asks for, not a
// measurement of the kernels.
//
// Compute type T: double in FP64 mode, float otherwise (the CPU's C). Every product the CPU rounds
// before an add is rounded on its own (rounded_product), so nvcc's fused multiply-adds do not merge it.
#include <cmath>
#include <vector>

#include "kernels/attention_tiles.h"
#include "kernels/cuda/attention_math.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/dropout_mask.cuh"
#include "kernels/dropout_mask.h"

namespace touchstone {

namespace {

constexpr int64_t kTile = kAttentionTile;
static_assert(kTile <= cuda::kBlockThreads, "one thread per key (query) of a tile");

// Where one row of the grid lives: row = (b * heads + head) * seq + index, heads = NH or NKV, seq = Tq or
// Tk; index is the row's index in its (window, head) slice, not its position in the window.
struct RowIndex {
  int64_t b, head, position, head_row;  // head_row = b * heads + head
};

__device__ RowIndex row_index(int64_t row, int64_t heads, int64_t seq) {
  const int64_t head_row = row / seq;
  return RowIndex{head_row / heads, head_row % heads, row % seq, head_row};
}

using cuda::exp_of;
using cuda::log_of;
using cuda::rounded_product;

// The value a GEMM operand holds: in BF16 mode P~ * M, P' and dS enter the following products as
// BF16, as the CPU's gemm_input rounds them (FP32 -> BF16 is the same as double -> FP32 -> BF16 here:
// the value is already an FP32 one).
template <typename T>
__device__ T gemm_input(T value, bool bf16_inputs) {
  return bf16_inputs ? static_cast<T>(round_to_bf16(static_cast<double>(value))) : value;
}

// sum_d a[d] b[d] in T, ascending d.
template <typename T>
__device__ T dot(const double* a, const double* b, int64_t n) {
  T sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += static_cast<T>(a[d]) * static_cast<T>(b[d]);
  return sum;
}

// One window's mask as the kernels read it: the rows' positions in the window and document ids (null
// without document masking), and the tile table.
struct Window {
  const int32_t *q_pos, *q_docs;  // [Tq] of the query rows
  const int32_t *k_pos, *k_docs;  // [Tk] of the key rows
  const uint8_t* needed;          // [query tiles, key tiles]: WindowMask::tile_needed(qt, kt)
  int64_t query_tiles, key_tiles;
  __device__ bool visible(int64_t i, int64_t j) const {
    return k_pos[j] <= q_pos[i] && (q_docs == nullptr || k_docs[j] == q_docs[i]);
  }
  __device__ bool tile_needed(int64_t qt, int64_t kt) const { return needed[qt * key_tiles + kt] != 0; }
};

// The AttentionBlock of one call on the device, with its tile table.
struct DeviceBlock {
  const int32_t *q_pos, *q_docs;  // [b*Tq]; docs null without document masking
  const int32_t *k_pos, *k_docs;  // [b*Tk]
  const uint8_t* needed;          // [b, query tiles, key tiles]
  int64_t query_seq, key_seq, window_seq;
  __device__ Window window(int64_t b) const {
    const int64_t q0 = b * query_seq, k0 = b * key_seq;
    const int64_t qtiles = (query_seq + kTile - 1) / kTile, ktiles = (key_seq + kTile - 1) / kTile;
    Window w{q_pos + q0, nullptr, k_pos + k0, nullptr, needed + b * qtiles * ktiles, qtiles, ktiles};
    if (q_docs != nullptr) {
      w.q_docs = q_docs + q0;
      w.k_docs = k_docs + k0;
    }
    return w;
  }
};

// The score as the CPU's GEMM stores it: alpha multiplies the finished dot product, in T.
template <typename T>
__device__ T score(const double* q_i, const double* k_j, int64_t dim, double scale) {
  return rounded_product(static_cast<T>(scale), dot<T>(q_i, k_j, dim));
}

// Inputs q[b,NH,Tq,D], k[b,NKV,Tk,D], v[b,NKV,Tk,D] and the block; outputs out[b*Tq, NH*D],
// lse[b,NH,Tq]. One block per query row (b, h, i); the row's slice of out holds the accumulator (each d
// owned by one thread) until it is divided by l.
template <typename T>
__global__ void attention_forward_kernel(const double* q, const double* k, const double* v, DeviceBlock block,
                                         cuda::AttentionKeep keep, AttentionShape shape, double scale,
                                         bool bf16_inputs, cpu::Rounding r, double* out, double* lse) {
  __shared__ T scores[kTile];   // S of the tile (-inf where not visible)
  __shared__ T weights[kTile];  // P~ = exp(S - m'), 0 where not visible
  __shared__ T inputs[kTile];   // P~ * M as the product with V reads it
  const int64_t seq = shape.seq, keys = block.key_seq, dim = shape.head_dim;
  const RowIndex at = row_index(blockIdx.x, shape.num_heads, seq);
  const int64_t i = at.position, h = at.head, qt = i / kTile;
  const int64_t g = h / (shape.num_heads / shape.num_kv_heads);
  const Window window = block.window(at.b);
  const double* q_i = q + (at.head_row * seq + i) * dim;                   // [D]
  const double* k_g = k + (at.b * shape.num_kv_heads + g) * keys * dim;    // [Tk,D]
  const double* v_g = v + (at.b * shape.num_kv_heads + g) * keys * dim;    // [Tk,D]
  double* o_i = out + (at.b * seq + i) * shape.num_heads * dim + h * dim;  // [D] of out's row b*Tq+i
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) o_i[d] = 0.0;

  const T minus_infinity = static_cast<T>(-INFINITY);
  T m = minus_infinity, l = 0;  // the running max and sum, the same in every thread
  const int64_t c = threadIdx.x;
  for (int64_t kt = 0; kt < window.key_tiles; ++kt) {
    if (!window.tile_needed(qt, kt)) continue;
    const int64_t j0 = kt * kTile, tk = keys - j0 < kTile ? keys - j0 : kTile;
    const bool visible = c < tk && window.visible(i, j0 + c);
    if (c < tk) scores[c] = visible ? score<T>(q_i, k_g + (j0 + c) * dim, dim, scale) : minus_infinity;
    __syncthreads();
    T tile_max = minus_infinity;
    for (int64_t e = 0; e < tk; ++e) tile_max = max(tile_max, scores[e]);  // exact: any order
    const T m_new = max(m, tile_max);
    if (m_new == minus_infinity) {  // no key visible to query i yet (the same in every thread)
      __syncthreads();
      continue;
    }
    // exp(-inf) = 0 clears what nothing had accumulated yet; acc and l are 0 there anyway.
    const T rescale = exp_of(m - m_new);
    if (c < tk) {
      const T weight = visible ? exp_of(scores[c] - m_new) : T(0);
      weights[c] = weight;
      const double m_ij =
          keep.active ? keep.at(at.b, h, window.q_pos[i], window.k_pos[j0 + c], block.window_seq) : 1.0;
      inputs[c] = gemm_input(keep.active ? weight * static_cast<T>(m_ij) : weight, bf16_inputs);
    }
    __syncthreads();
    T sum = 0;
    for (int64_t e = 0; e < tk; ++e) sum += weights[e];  // ascending, as the CPU's row loop
    l = rounded_product(l, rescale) + sum;
    m = m_new;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      T tile = 0;  // (P~ * M) V_J of this d, ascending keys
      for (int64_t e = 0; e < tk; ++e) tile += inputs[e] * static_cast<T>(v_g[(j0 + e) * dim + d]);
      o_i[d] = static_cast<double>(rounded_product(static_cast<T>(o_i[d]), rescale) + tile);
    }
    __syncthreads();  // every thread has read this tile's shared rows before the next overwrites them
  }
  if (l == T(0)) {  // no key of the block visible to query i: out stays 0 (not 0 / 0), lse = -inf
    if (threadIdx.x == 0) lse[at.head_row * seq + i] = -INFINITY;
    return;
  }
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    o_i[d] = r.activation(static_cast<double>(static_cast<T>(o_i[d]) / l));
  if (threadIdx.x == 0) lse[at.head_row * seq + i] = static_cast<double>(m + log_of(l));
}

// delta[b,NH,Tq] = dO_i . O_i for every query row (the softmax backward's row sum), in T, ascending d.
template <typename T>
__global__ void attention_delta_kernel(const double* dout, const double* out, AttentionShape shape,
                                       double* delta) {
  const int64_t seq = shape.seq, dim = shape.head_dim, heads = shape.num_heads;
  TOUCHSTONE_GRID_STRIDE_LOOP(row, shape.windows * heads * seq) {
    const RowIndex at = row_index(row, heads, seq);
    const int64_t offset = (at.b * seq + at.position) * heads * dim + at.head * dim;  // of [b*Tq, NH*D]
    T sum = 0;
    for (int64_t d = 0; d < dim; ++d)
      sum = sum + rounded_product(static_cast<T>(dout[offset + d]), static_cast<T>(out[offset + d]));
    delta[row] = static_cast<double>(sum);
  }
}

// What the backward needs of one visible (i, j), recomputed as the CPU does: dS and P' as the
// following products read them (BF16 in BF16 mode). keep: M_ij, read only with dropout.
template <typename T>
struct Entry {
  T ds, dropped;
};

template <typename T>
__device__ Entry<T> entry(const double* q_i, const double* k_j, const double* do_i, const double* v_j,
                          int64_t dim, double scale, double lse_i, double delta_i, bool dropout, double keep,
                          bool bf16_inputs) {
  const T p = exp_of(score<T>(q_i, k_j, dim, scale) - static_cast<T>(lse_i));  // exactly the forward's P
  T dp = dot<T>(do_i, v_j, dim);  // dO_i . V_j, stored in T as the CPU's GEMM result
  if (dropout) dp = rounded_product(dp, static_cast<T>(keep));
  const T ds = p * (dp - static_cast<T>(delta_i));
  const T dropped = dropout ? p * static_cast<T>(keep) : p;
  return Entry<T>{gemm_input(ds, bf16_inputs), gemm_input(dropped, bf16_inputs)};
}

// Inputs dout[b*Tq, NH*D], q[b,NH,Tq,D], k, v [b,NKV,Tk,D], lse and delta [b,NH,Tq], the block; output
// dq[b,NH,Tq,D]. One block per query row (b, h, i); the row of dq holds the FP32 (FP64) accumulator
// until it is stored as an activation.
template <typename T>
__global__ void attention_dq_kernel(const double* dout, const double* q, const double* k, const double* v,
                                    const double* lse, const double* delta, DeviceBlock block,
                                    cuda::AttentionKeep keep, AttentionShape shape, double scale,
                                    bool bf16_inputs, cpu::Rounding r, double* dq) {
  __shared__ T ds_row[kTile];  // dS_ij of the tile's keys, 0 where not visible
  const int64_t seq = shape.seq, keys = block.key_seq, dim = shape.head_dim;
  const RowIndex at = row_index(blockIdx.x, shape.num_heads, seq);
  const int64_t i = at.position, h = at.head, qt = i / kTile;
  const int64_t g = h / (shape.num_heads / shape.num_kv_heads);
  const Window window = block.window(at.b);
  const double* q_i = q + (at.head_row * seq + i) * dim;                           // [D]
  const double* do_i = dout + (at.b * seq + i) * shape.num_heads * dim + h * dim;  // [D] of dout's row
  const double* k_g = k + (at.b * shape.num_kv_heads + g) * keys * dim;            // [Tk,D]
  const double* v_g = v + (at.b * shape.num_kv_heads + g) * keys * dim;            // [Tk,D]
  const double lse_i = lse[at.head_row * seq + i], delta_i = delta[at.head_row * seq + i];
  double* dq_i = dq + (at.head_row * seq + i) * dim;  // [D]
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dq_i[d] = 0.0;

  const int64_t c = threadIdx.x;
  for (int64_t kt = 0; kt < window.key_tiles; ++kt) {
    if (!window.tile_needed(qt, kt)) continue;
    const int64_t j0 = kt * kTile, tk = keys - j0 < kTile ? keys - j0 : kTile;
    if (c < tk) {
      const int64_t j = j0 + c;
      T ds = 0;
      if (window.visible(i, j)) {
        const double m_ij =
            keep.active ? keep.at(at.b, h, window.q_pos[i], window.k_pos[j], block.window_seq) : 1.0;
        const Entry<T> e = entry<T>(q_i, k_g + j * dim, do_i, v_g + j * dim, dim, scale, lse_i, delta_i,
                                    keep.active, m_ij, bf16_inputs);
        ds = e.ds;
      }
      ds_row[c] = ds;
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      T tile = 0;  // dS_iJ K_J of this d, ascending keys; alpha after the sum as in the GEMM
      for (int64_t e = 0; e < tk; ++e) tile += ds_row[e] * static_cast<T>(k_g[(j0 + e) * dim + d]);
      dq_i[d] = static_cast<double>(static_cast<T>(dq_i[d]) + rounded_product(static_cast<T>(scale), tile));
    }
    __syncthreads();
  }
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dq_i[d] = r.activation(dq_i[d]);
}

// Inputs as attention_dq_kernel's; outputs dk, dv [b,NKV,Tk,D]. One block per key row (b, g, j): per
// head h of group g in ascending order, per query tile in ascending order, thread d adds the tile's
// scale dS^T Q and P'^T dO to the group's FP32 (FP64) totals, as the CPU's per-tile GEMMs accumulate
// into dK and dV; stored once, as activations.
template <typename T>
__global__ void attention_dkv_kernel(const double* dout, const double* q, const double* k, const double* v,
                                     const double* lse, const double* delta, DeviceBlock block,
                                     cuda::AttentionKeep keep, AttentionShape shape, double scale,
                                     bool bf16_inputs, cpu::Rounding r, double* dk, double* dv) {
  __shared__ T ds_col[kTile];       // dS_ij of the tile's queries, 0 where not visible
  __shared__ T dropped_col[kTile];  // P'_ij
  const int64_t seq = shape.seq, keys = block.key_seq, dim = shape.head_dim, heads = shape.num_heads;
  const RowIndex at = row_index(blockIdx.x, shape.num_kv_heads, keys);
  const int64_t j = at.position, g = at.head, kt = j / kTile;
  const int64_t queries_per_group = heads / shape.num_kv_heads, out_width = heads * dim;
  const Window window = block.window(at.b);
  const double* k_j = k + (at.head_row * keys + j) * dim;  // [D]
  const double* v_j = v + (at.head_row * keys + j) * dim;  // [D]
  double* dk_j = dk + (at.head_row * keys + j) * dim;      // [D] the accumulators until the end
  double* dv_j = dv + (at.head_row * keys + j) * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dk_j[d] = dv_j[d] = 0.0;

  const int64_t c = threadIdx.x;
  for (int64_t h = g * queries_per_group; h < (g + 1) * queries_per_group; ++h) {
    const int64_t head_row = at.b * heads + h;
    const double* q_h = q + head_row * seq * dim;                  // [Tq,D]
    const double* do_h = dout + at.b * seq * out_width + h * dim;  // [Tq,D] with row stride NH*D
    for (int64_t qt = 0; qt < window.query_tiles; ++qt) {
      if (!window.tile_needed(qt, kt)) continue;
      const int64_t i0 = qt * kTile, tq = seq - i0 < kTile ? seq - i0 : kTile;
      if (c < tq) {
        const int64_t i = i0 + c;
        Entry<T> e{T(0), T(0)};
        if (window.visible(i, j)) {
          const double m_ij =
              keep.active ? keep.at(at.b, h, window.q_pos[i], window.k_pos[j], block.window_seq) : 1.0;
          e = entry<T>(q_h + i * dim, k_j, do_h + i * out_width, v_j, dim, scale, lse[head_row * seq + i],
                       delta[head_row * seq + i], keep.active, m_ij, bf16_inputs);
        }
        ds_col[c] = e.ds;
        dropped_col[c] = e.dropped;
      }
      __syncthreads();
      for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
        T dk_tile = 0, dv_tile = 0;  // ascending queries
        for (int64_t e = 0; e < tq; ++e) {
          dk_tile += ds_col[e] * static_cast<T>(q_h[(i0 + e) * dim + d]);
          dv_tile += dropped_col[e] * static_cast<T>(do_h[(i0 + e) * out_width + d]);
        }
        dk_j[d] =
            static_cast<double>(static_cast<T>(dk_j[d]) + rounded_product(static_cast<T>(scale), dk_tile));
        dv_j[d] = static_cast<double>(static_cast<T>(dv_j[d]) + dv_tile);
      }
      __syncthreads();
    }
  }
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    dk_j[d] = r.activation(dk_j[d]);
    dv_j[d] = r.activation(dv_j[d]);
  }
}

// needed[b, query tiles, key tiles]: WindowMask::tile_needed of each window, the CPU reference's tile
// rule. `count`, when given, gains the pairs of every window once per query head, as the CPU counts them.
std::vector<uint8_t> needed_tiles(const AttentionBlock& block, bool document_masking, const AttentionShape& s,
                                  AttentionTileCount* count) {
  const int64_t Tq = s.seq, Tk = block.key_seq;
  const int64_t query_tiles = (Tq + kTile - 1) / kTile, key_tiles = (Tk + kTile - 1) / kTile;
  std::vector<uint8_t> needed(static_cast<size_t>(s.windows * query_tiles * key_tiles));
  for (int64_t b = 0; b < s.windows; ++b) {
    AttentionBlock window = block;  // window b alone; its document ids only with masking (null without)
    window.query_positions += b * Tq;
    window.key_positions += b * Tk;
    window.query_document_ids = document_masking ? block.query_document_ids + b * Tq : nullptr;
    window.key_document_ids = document_masking ? block.key_document_ids + b * Tk : nullptr;
    const WindowMask mask(window, Tq, 0, document_masking, false);
    for (int64_t qt = 0; qt < query_tiles; ++qt) {
      for (int64_t kt = 0; kt < key_tiles; ++kt)
        needed[static_cast<size_t>((b * query_tiles + qt) * key_tiles + kt)] =
            mask.tile_needed(qt, kt) ? 1 : 0;
    }
    if (count != nullptr) {
      const AttentionTileCount pairs = mask.count();
      count->computed += pairs.computed * s.num_heads;
      count->skipped += pairs.skipped * s.num_heads;
    }
  }
  return needed;
}

// The block of one call uploaded, with its tile table (see needed_tiles for `count`).
DeviceBlock upload_block(const AttentionBlock& block, bool document_masking, const AttentionShape& s,
                         cuda::Staging& staging, AttentionTileCount* count) {
  const std::vector<uint8_t> needed = needed_tiles(block, document_masking, s, count);
  const int64_t query_rows = s.windows * s.seq, key_rows = s.windows * block.key_seq;
  return DeviceBlock{staging.upload(block.query_positions, query_rows),
                     document_masking ? staging.upload(block.query_document_ids, query_rows) : nullptr,
                     staging.upload(block.key_positions, key_rows),
                     document_masking ? staging.upload(block.key_document_ids, key_rows) : nullptr,
                     staging.upload(needed.data(), static_cast<int64_t>(needed.size())),
                     s.seq,
                     block.key_seq,
                     block.window_seq};
}

// The dropout of one call as the kernels take it; samples uploaded only when it is active.
cuda::AttentionKeep attention_keep(const AttentionDropout& dropout, int64_t windows, const cpu::Rounding& r,
                                   cuda::Staging& s) {
  cuda::AttentionKeep keep;
  if (!dropout.active()) return keep;
  keep.active = true;
  keep.key0 = dropout.site.key[0];
  keep.key1 = dropout.site.key[1];
  keep.probability = dropout.site.probability;
  keep.kept = dropout_kept_value(dropout.site.probability, r);    // FP32 unless FP64, as on the CPU
  keep.samples = s.upload(dropout.site.sample_indices, windows);  // [b]
  keep.first_head = dropout.first_head;
  return keep;
}

}  // namespace

void CudaBackend::attention_block_forward(const double* q, const double* k, const double* v,
                                          const AttentionBlock& block, bool document_masking,
                                          const AttentionDropout& dropout, const AttentionShape& shape,
                                          double* out, double* lse) {
  const int64_t b = shape.windows, Tq = shape.seq, Tk = block.key_seq, NH = shape.num_heads;
  const int64_t NKV = shape.num_kv_heads, D = shape.head_dim;
  const cuda::Launch launch = cuda::per_row(b * NH * Tq);  // one block per query row
  if (launch.blocks == 0) return;
  cuda::Staging& s = begin_call();
  const DeviceBlock d_block = upload_block(block, document_masking, shape, s, &tiles_);
  const double* d_q = s.upload(q, b * NH * Tq * D);   // [b,NH,Tq,D]
  const double* d_k = s.upload(k, b * NKV * Tk * D);  // [b,NKV,Tk,D]
  const double* d_v = s.upload(v, b * NKV * Tk * D);  // [b,NKV,Tk,D]
  const cuda::AttentionKeep keep = attention_keep(dropout, b, rounding_, s);
  double* d_out = s.output<double>(b * Tq * NH * D);  // [b*Tq, NH*D]
  double* d_lse = s.output<double>(b * NH * Tq);      // [b,NH,Tq]
  const bool bf16_inputs = precision() == Precision::kBf16;
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(attention_forward_kernel<decltype(compute)>, launch, stream_, d_q, d_k, d_v, d_block,
                        keep, shape, shape.scale(), bf16_inputs, rounding_, d_out, d_lse);
  });
  cuda::check_launch("attention_block_forward");
  s.download(out, d_out, b * Tq * NH * D);
  s.download(lse, d_lse, b * NH * Tq);
  s.finish();
}

void CudaBackend::attention_block_backward(const double* dout, const double* q, const double* k,
                                           const double* v, const double* out, const double* lse,
                                           const AttentionBlock& block, bool document_masking,
                                           const AttentionDropout& dropout, const AttentionShape& shape,
                                           double* dq, double* dk, double* dv) {
  const int64_t b = shape.windows, Tq = shape.seq, Tk = block.key_seq, NH = shape.num_heads;
  const int64_t NKV = shape.num_kv_heads, D = shape.head_dim;
  const cuda::Launch query_rows = cuda::per_row(b * NH * Tq), key_rows = cuda::per_row(b * NKV * Tk);
  if (query_rows.blocks == 0 && key_rows.blocks == 0) return;
  cuda::Staging& s = begin_call();
  const DeviceBlock d_block = upload_block(block, document_masking, shape, s, nullptr);
  const double* d_dout = s.upload(dout, b * Tq * NH * D);  // [b*Tq, NH*D]
  const double* d_q = s.upload(q, b * NH * Tq * D);        // [b,NH,Tq,D]
  const double* d_k = s.upload(k, b * NKV * Tk * D);       // [b,NKV,Tk,D]
  const double* d_v = s.upload(v, b * NKV * Tk * D);       // [b,NKV,Tk,D]
  const double* d_out = s.upload(out, b * Tq * NH * D);    // [b*Tq, NH*D]
  const double* d_lse = s.upload(lse, b * NH * Tq);        // [b,NH,Tq]
  const cuda::AttentionKeep keep = attention_keep(dropout, b, rounding_, s);
  double* d_dq = s.output<double>(b * NH * Tq * D);   // [b,NH,Tq,D]
  double* d_dk = s.output<double>(b * NKV * Tk * D);  // [b,NKV,Tk,D]
  double* d_dv = s.output<double>(b * NKV * Tk * D);  // [b,NKV,Tk,D]
  double* d_delta = s.output<double>(b * NH * Tq);    // [b,NH,Tq] Delta, for this call only
  const bool bf16_inputs = precision() == Precision::kBf16;
  cuda::with_compute_type(precision(), [&](auto compute) {
    using C = decltype(compute);
    cuda::launch_kernel(attention_delta_kernel<C>, cuda::per_element(b * NH * Tq), stream_, d_dout, d_out,
                        shape, d_delta);
    cuda::check_launch("attention_block_backward (delta)");
    cuda::launch_kernel(attention_dq_kernel<C>, query_rows, stream_, d_dout, d_q, d_k, d_v, d_lse, d_delta,
                        d_block, keep, shape, shape.scale(), bf16_inputs, rounding_, d_dq);
    cuda::check_launch("attention_block_backward (dq)");
    cuda::launch_kernel(attention_dkv_kernel<C>, key_rows, stream_, d_dout, d_q, d_k, d_v, d_lse, d_delta,
                        d_block, keep, shape, shape.scale(), bf16_inputs, rounding_, d_dk, d_dv);
    cuda::check_launch("attention_block_backward (dk, dv)");
  });
  s.download(dq, d_dq, b * NH * Tq * D);
  s.download(dk, d_dk, b * NKV * Tk * D);
  s.download(dv, d_dv, b * NKV * Tk * D);
  s.finish();
}

}  // namespace touchstone
