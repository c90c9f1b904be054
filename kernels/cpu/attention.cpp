// CPU document-masked causal attention with grouped KV heads, in tiles (the flash-attention algorithm):
// forward and backward side by side. Memory is O(T) per head: only lse[T] is kept for the backward.
// A call covers Tq query rows against Tk key rows of one block (AttentionBlock, kernels/backend.h); the
// mask compares their positions in the window, so the whole window is the block of positions 0..T-1.
//
// Per (window b, query head h, its KV head g), queries and keys in tiles of kTile positions:
//   forward, per query tile I, over the key tiles J the mask leaves nonempty, in order (the loops run
//   key tiles outermost, so each K_J is transposed once; every row still takes its J in this order):
//     S = Q_I K_J^T * scale                                      [tq,tk]
//     m' = max(m, row max of S over the visible keys)            [tq]  the running max
//     P~ = exp(S - m') where visible, 0 elsewhere                [tq,tk]
//     l = l * exp(m - m') + row sum of P~                        [tq]  the running sum
//     acc = acc * exp(m - m') + (P~ * M_IJ) V_J                  [tq,D] M: the dropout mask's tile
//   then O_I = acc / l and lse_I = m + log l (a row that saw no key of the block: O = 0, lse = -inf).
//   backward, per KV group (b, g): its query heads h, key tiles J, query tiles I, in order:
//     P = exp(S - lse_I) where visible (recomputed, exactly the forward's P), P' = P * M_IJ
//     dV_J += P'^T dO_I;  dP = (dO_I V_J^T) * M_IJ;  dS = P * (dP - Delta_I)
//     dQ_I += dS K_J * scale;  dK_J += dS^T Q_I * scale
//   with Delta_i = dO_i . O_i = sum_j P_ij dP_ij (O_i = sum_j P_ij M_ij V_j, so the softmax backward's
//   row sum needs no second pass over the keys, with or without dropout).
// A tile pair is skipped when every key of J lies after every query of I, or (document masking) no
// document id of I's queries falls in the range of J's keys' ids; attention_tiles counts both kinds.
//
// Precision: in FP64 everything is double. In FP32 and BF16 modes the scores, the running max and sum,
// the exponentials, the dropout multiply, the accumulators and the softmax backward are FP32; as flash
// attention does, the BF16 mode feeds P~ * M (and P', dS in the backward) to the GEMMs in BF16 and
// stores O, dQ, dK, dV in BF16; lse is FP32.
//
// Threads (parallel_for.h): the forward splits over (b, h), each writing its own rows of out and lse;
// the backward over (b, g), each writing its group's dK, dV and its heads' dQ. Every sum runs inside
// one task in the order above, so the bits do not depend on the thread count. Merging the results of
// blocks of keys (attention_merge): attention_merge.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_tiles.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/exp_fp64.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_for.h"
#include "kernels/cpu/row_reductions.h"
#include "kernels/dropout_mask.h"

namespace touchstone {

namespace {

using cpu::Store;

constexpr int64_t kTile = kAttentionTile;

cpu::RoundTo scores_format(Precision p) {
  return p == Precision::kFp64 ? cpu::RoundTo::kNone : cpu::RoundTo::kFp32;
}

// In BF16 mode a GEMM operand (P~ * M, P', dS) enters as BF16: m[n] rounded into `copy`.
const double* gemm_input(const double* m, int64_t n, Precision p, double* copy) {
  if (p != Precision::kBf16) return m;
  for (int64_t i = 0; i < n; ++i) copy[i] = round_to_bf16(m[i]);
  return copy;
}

// One (window, query head) slice of the inputs and outputs, with the shapes of attention_block_forward.
struct HeadSlice {
  const double* q;     // [Tq,D]
  const double* k;     // [Tk,D] its KV head
  const double* v;     // [Tk,D]
  int64_t window;      // b
  int64_t head;        // h, local
  int64_t out_offset;  // of row 0 of this head in out[b*Tq, NH*D]
};

HeadSlice head_slice(const double* q, const double* k, const double* v, const AttentionShape& s, int64_t Tk,
                     int64_t b, int64_t h) {
  const int64_t Tq = s.seq, D = s.head_dim, g = h / (s.num_heads / s.num_kv_heads);
  return HeadSlice{q + (b * s.num_heads + h) * Tq * D,
                   k + (b * s.num_kv_heads + g) * Tk * D,
                   v + (b * s.num_kv_heads + g) * Tk * D,
                   b,
                   h,
                   b * Tq * s.num_heads * D + h * D};
}

// The dropout mask of one tile pair, or nothing: keep[tq,tk] = M_ij, keyed by the positions in the window.
struct TileDropout {
  const AttentionDropout& dropout;
  double kept;
  int64_t window_seq;
  void fill(const HeadSlice& x, const WindowMask& mask, int64_t i0, int64_t tq, int64_t j0, int64_t tk,
            double* keep) const {
    const int64_t sample = dropout.site.sample_indices[x.window];
    for (int64_t r = 0; r < tq; ++r) {
      for (int64_t c = 0; c < tk; ++c) {
        const int64_t element = attention_dropout_element(
            dropout.first_head + x.head, mask.query_position(i0 + r), mask.key_position(j0 + c), window_seq);
        keep[r * tk + c] = dropout_keep_scale(dropout.site, sample, element, kept);
      }
    }
  }
};

// K_J^T (or V_J^T): rows [j0, j0 + tk) of m[Tk,D] into m_t[D,tk], once per key tile, so that the
// products with Q_I and dO_I run as A B: OpenBLAS computes A B^T on 64 x 64 tiles at about two thirds
// of A B's rate (docs/BENCHMARKS.md). The scores are the same dot products either way; on tiles
// shorter than 64 some of OpenBLAS's kernels add their terms in another order, within the FP64 bound
// that tests/unit/test_attention_tiled.cpp derives for any order.
void transpose_tile(const double* m, int64_t j0, int64_t tk, int64_t D, double* m_t) {
  for (int64_t c = 0; c < tk; ++c) {
    for (int64_t d = 0; d < D; ++d) m_t[d * tk + c] = m[(j0 + c) * D + d];
  }
}

// S = Q_I K_J^T * scale [tq,tk] for query rows [i0, i0 + tq), from K_J^T [D,tk] (transpose_tile).
void score_tile(Precision p, const AttentionShape& s, const HeadSlice& x, int64_t i0, int64_t tq,
                const double* key_t, int64_t tk, double* scores) {
  const int64_t D = s.head_dim;
  cpu::gemm(p, scores_format(p), false, false, tq, tk, D, s.scale(), x.q + i0 * D, D, key_t, tk,
            Store::kOverwrite, scores, tk);
}

// The forward's step for one tile pair (I, J), the lines m' ... acc above, on query tile I's rows of the
// running max m[tq], sum l[tq] and accumulator acc[tq,D]: scores[tq,tk] holds S on entry and P~ * M on
// return, ready for the product with V_J. keep[tq,tk] is the dropout mask's tile, or null.
template <typename C>
void online_softmax_step(const WindowMask& mask, int64_t qt, int64_t kt, const double* keep, int64_t D,
                         double* scores, double* m, double* l, double* acc) {
  const int64_t i0 = qt * kTile, tq = std::min(kTile, mask.query_rows() - i0);
  const int64_t j0 = kt * kTile, tk = std::min(kTile, mask.key_rows() - j0);
  const bool unmasked = mask.tile_unmasked(qt, kt);  // every key visible to every query, nothing added
  constexpr C kNone = -std::numeric_limits<C>::infinity();
  C new_max[kTile];     // [tq] m', or -inf while no key is visible to the query
  C shift[kTile] = {};  // [tq] what the exponentials subtract: m', or 0 for a row of -inf
  // Pass 1, per row: the masked scores to -inf (their exponentials are 0) and m'.
  for (int64_t r = 0; r < tq; ++r) {
    const int64_t i = i0 + r;
    double* srow = scores + r * tk;
    C tile_max = kNone;
    if (unmasked) {
      tile_max = cpu::row_max<C>(srow, tk);
    } else {
      for (int64_t c = 0; c < tk; ++c) {
        if (!mask.visible(i, j0 + c)) {
          srow[c] = -std::numeric_limits<double>::infinity();
          continue;
        }
        srow[c] = static_cast<double>(static_cast<C>(srow[c]) + static_cast<C>(mask.bias(i, j0 + c)));
        tile_max = std::max(tile_max, static_cast<C>(srow[c]));
      }
    }
    new_max[r] = std::max(static_cast<C>(m[r]), tile_max);
    shift[r] = new_max[r];
    if (new_max[r] == kNone) {  // no key visible to query i yet: P~ = exp(-inf) = 0
      std::fill(srow, srow + tk, -std::numeric_limits<double>::infinity());
      shift[r] = 0;  // -inf - (-inf) would be NaN
    }
  }
  cpu::exp_rows<C>(scores, tq, tk, shift, scores);  // P~ = exp(S - m'), the whole tile in one call
  // Pass 2, per row: l, m and acc take the tile.
  for (int64_t r = 0; r < tq; ++r) {
    double* srow = scores + r * tk;
    if (new_max[r] == kNone) continue;        // nothing to take yet: m, l and acc stay -inf, 0 and 0
    const C sum = cpu::row_sum<C>(srow, tk);  // of P~, before the dropout mask
    if (keep) {
      for (int64_t c = 0; c < tk; ++c)
        srow[c] = static_cast<double>(static_cast<C>(srow[c]) * static_cast<C>(keep[r * tk + c]));
    }
    // exp(-inf) = 0 clears what nothing had accumulated yet; acc and l are 0 there anyway.
    const C rescale = std::exp(static_cast<C>(m[r]) - new_max[r]);
    m[r] = static_cast<double>(new_max[r]);
    l[r] = static_cast<double>(static_cast<C>(l[r]) * rescale + sum);
    if (rescale == C(1)) continue;  // the max did not move: acc * 1 is acc, bit for bit
    for (int64_t d = 0; d < D; ++d)
      acc[r * D + d] = static_cast<double>(static_cast<C>(acc[r * D + d]) * rescale);
  }
}

// Forward of one (window, query head): the key tiles J in order, each transposed once, and for each
// the query tiles I it reaches; every query row still sees its key tiles in ascending order, so each
// row's running max, sum and accumulator take the steps listed above. Returns the tile pairs computed
// and skipped.
template <typename C>
AttentionTileCount forward_head(Precision p, const AttentionShape& s, const WindowMask& mask,
                                const TileDropout* dropout, const HeadSlice& x, int64_t Tk, double* slot,
                                double* out, double* lse) {
  const int64_t Tq = s.seq, D = s.head_dim, out_width = s.num_heads * D;
  double* scores = slot;                  // [tq,tk] S, then P~ * M
  double* keep = scores + kTile * kTile;  // [tq,tk] M
  double* input = keep + kTile * kTile;   // [tq,tk] the BF16 copy of P~ * M
  double* key_t = input + kTile * kTile;  // [D,tk] K_J^T
  double* acc = key_t + kTile * D;        // [Tq,D]
  double* m = acc + Tq * D;               // [Tq] the running max
  double* l = m + Tq;                     // [Tq] the running sum
  std::fill(acc, acc + Tq * D, 0.0);
  std::fill(m, m + Tq, -std::numeric_limits<double>::infinity());
  std::fill(l, l + Tq, 0.0);
  AttentionTileCount count;
  for (int64_t kt = 0; kt < mask.key_tiles(); ++kt) {
    const int64_t j0 = kt * kTile, tk = std::min(kTile, Tk - j0);
    transpose_tile(x.k, j0, tk, D, key_t);
    for (int64_t qt = 0; qt < mask.query_tiles(); ++qt) {
      if (!mask.tile_needed(qt, kt)) {
        ++count.skipped;
        continue;
      }
      ++count.computed;
      const int64_t i0 = qt * kTile, tq = std::min(kTile, Tq - i0);
      score_tile(p, s, x, i0, tq, key_t, tk, scores);
      if (dropout) dropout->fill(x, mask, i0, tq, j0, tk, keep);
      online_softmax_step<C>(mask, qt, kt, dropout ? keep : nullptr, D, scores, m + i0, l + i0, acc + i0 * D);
      cpu::gemm(p, scores_format(p), false, false, tq, D, tk, 1.0, gemm_input(scores, tq * tk, p, input), tk,
                x.v + j0 * D, D, Store::kAccumulate, acc + i0 * D, D);
    }
  }
  const cpu::Rounding rounding{p};
  for (int64_t i = 0; i < Tq; ++i) {
    const C sum = static_cast<C>(l[i]);  // >= 1 once a key was seen (the row's max contributes exp(0))
    double* o = out + x.out_offset + i * out_width;
    if (sum == C(0)) {  // no key of this block is visible to the query (a whole window: never)
      std::fill(o, o + D, 0.0);
      lse[i] = -std::numeric_limits<double>::infinity();
      continue;
    }
    for (int64_t d = 0; d < D; ++d)
      o[d] = rounding.activation(static_cast<double>(static_cast<C>(acc[i * D + d]) / sum));
    lse[i] = static_cast<double>(static_cast<C>(m[i]) + std::log(sum));
  }
  return count;
}

// Backward of one (window, query head) into its dq[Tq,D] (FP32 sums unless FP64) and its group's
// dk, dv [Tk,D] accumulators.
template <typename C>
void backward_head(Precision p, const AttentionShape& s, const WindowMask& mask, const TileDropout* dropout,
                   const HeadSlice& x, int64_t Tk, const double* dout, const double* out, const double* lse,
                   double* slot, double* dq, double* dk, double* dv) {
  const int64_t Tq = s.seq, D = s.head_dim, out_width = s.num_heads * D;
  const cpu::RoundTo accumulate = scores_format(p);
  double* probs = slot;                     // [tq,tk] P, then P'
  double* dprobs = probs + kTile * kTile;   // [tq,tk] dP', then dS
  double* keep = dprobs + kTile * kTile;    // [tq,tk] M
  double* input = keep + kTile * kTile;     // [tq,tk] a BF16 copy
  double* key_t = input + kTile * kTile;    // [D,tk] K_J^T
  double* value_t = key_t + kTile * D;      // [D,tk] V_J^T
  double* delta = value_t + kTile * D;      // [Tq] Delta_i = dO_i . O_i
  const double* doh = dout + x.out_offset;  // [Tq,D] with row stride NH*D
  const double* oh = out + x.out_offset;
  for (int64_t i = 0; i < Tq; ++i) {
    C dot = 0;
    for (int64_t d = 0; d < D; ++d)
      dot += static_cast<C>(doh[i * out_width + d]) * static_cast<C>(oh[i * out_width + d]);
    delta[i] = static_cast<double>(dot);
  }
  std::fill(dq, dq + Tq * D, 0.0);
  for (int64_t kt = 0; kt < mask.key_tiles(); ++kt) {
    const int64_t j0 = kt * kTile, tk = std::min(kTile, Tk - j0);
    transpose_tile(x.k, j0, tk, D, key_t);
    transpose_tile(x.v, j0, tk, D, value_t);
    for (int64_t qt = 0; qt < mask.query_tiles(); ++qt) {
      if (!mask.tile_needed(qt, kt)) continue;
      const int64_t i0 = qt * kTile, tq = std::min(kTile, Tq - i0);
      score_tile(p, s, x, i0, tq, key_t, tk, probs);
      if (dropout) dropout->fill(x, mask, i0, tq, j0, tk, keep);
      // P = exp(S - lse): S, or -inf where masked (its exponential is 0), then the exponentials, which
      // subtract each row's lse in their lanes (0 for a row that sees no key: -inf - (-inf) is NaN).
      C shift[kTile] = {};  // [tq]
      for (int64_t r = 0; r < tq; ++r) {
        shift[r] =
            lse[i0 + r] == -std::numeric_limits<double>::infinity() ? C(0) : static_cast<C>(lse[i0 + r]);
      }
      if (!mask.tile_unmasked(qt, kt)) {  // unmasked: every key visible, nothing added, S as it is
        for (int64_t r = 0; r < tq; ++r) {
          const int64_t i = i0 + r;
          double* row = probs + r * tk;
          for (int64_t c = 0; c < tk; ++c) {
            row[c] = mask.visible(i, j0 + c)
                         ? static_cast<double>(static_cast<C>(row[c]) + static_cast<C>(mask.bias(i, j0 + c)))
                         : -std::numeric_limits<double>::infinity();
          }
        }
      }
      cpu::exp_rows<C>(probs, tq, tk, shift, probs);
      // dP' = dO_I V_J^T, before P is overwritten by P'
      cpu::gemm(p, scores_format(p), false, false, tq, tk, D, 1.0, doh + i0 * out_width, out_width, value_t,
                tk, Store::kOverwrite, dprobs, tk);
      for (int64_t r = 0; r < tq; ++r) {
        const C delta_i = static_cast<C>(delta[i0 + r]);
        const int64_t row_end = (r + 1) * tk;
        if (!dropout) {  // dS = P * (dP' - Delta_i); P' = P
          for (int64_t e = r * tk; e < row_end; ++e)
            dprobs[e] = static_cast<double>(static_cast<C>(probs[e]) * (static_cast<C>(dprobs[e]) - delta_i));
          continue;
        }
        for (int64_t e = r * tk; e < row_end; ++e) {
          const C pe = static_cast<C>(probs[e]), kept = static_cast<C>(keep[e]);
          dprobs[e] = static_cast<double>(pe * (static_cast<C>(dprobs[e]) * kept - delta_i));  // dS
          probs[e] = static_cast<double>(pe * kept);                                           // P'
        }
      }
      // dV_J += P'^T dO_I
      cpu::gemm(p, accumulate, true, false, tk, D, tq, 1.0, gemm_input(probs, tq * tk, p, input), tk,
                doh + i0 * out_width, out_width, Store::kAccumulate, dv + j0 * D, D);
      // dQ_I += dS K_J * scale;  dK_J += dS^T Q_I * scale
      const double* ds = gemm_input(dprobs, tq * tk, p, input);
      cpu::gemm(p, accumulate, false, false, tq, D, tk, s.scale(), ds, tk, x.k + j0 * D, D,
                Store::kAccumulate, dq + i0 * D, D);
      cpu::gemm(p, accumulate, true, false, tk, D, tq, s.scale(), ds, tk, x.q + i0 * D, D, Store::kAccumulate,
                dk + j0 * D, D);
    }
  }
}

}  // namespace

int64_t CpuBackend::attention_forward_scratch(const AttentionShape& s) {
  return 3 * kTile * kTile + kTile * s.head_dim + s.seq * s.head_dim + 2 * s.seq;
}

int64_t CpuBackend::attention_backward_scratch(const AttentionShape& s) {
  return 4 * kTile * kTile + 2 * kTile * s.head_dim + s.seq;
}

void CpuBackend::attention_block_forward(const double* q, const double* k, const double* v,
                                         const AttentionBlock& block, bool document_masking,
                                         const AttentionDropout& dropout, const AttentionShape& s,
                                         double* out, double* lse) {
  const int64_t Tq = s.seq, Tk = block.key_seq;
  const bool added = mask_form() == MaskForm::kAllowedAdded;
  std::vector<WindowMask> masks;  // [b]
  for (int64_t b = 0; b < s.windows; ++b) masks.emplace_back(block, Tq, b, document_masking, added);
  const TileDropout tile_dropout{dropout, dropout_kept_value(dropout.site.probability, rounding_),
                                 block.window_seq};
  const TileDropout* drop = dropout.active() ? &tile_dropout : nullptr;
  std::vector<AttentionTileCount> counts(static_cast<size_t>(s.windows * s.num_heads));
  cpu::ThreadScratch scratch(attention_forward_scratch(s));
  const cpu::SingleThreadedBlas blas;
  // A task's work: Tq queries against the Tk keys, D products each.
  cpu::parallel_for(s.windows * s.num_heads, Tq * Tk * s.head_dim, [&](int64_t task) {
    const int64_t h = task % s.num_heads, b = task / s.num_heads;
    const HeadSlice x = head_slice(q, k, v, s, Tk, b, h);
    const WindowMask& mask = masks[static_cast<size_t>(b)];
    double* head_lse = lse + (b * s.num_heads + h) * Tq;
    counts[static_cast<size_t>(task)] =
        precision() == Precision::kFp64
            ? forward_head<double>(precision(), s, mask, drop, x, Tk, scratch.slot(), out, head_lse)
            : forward_head<float>(precision(), s, mask, drop, x, Tk, scratch.slot(), out, head_lse);
  });
  for (const AttentionTileCount& c : counts) {
    tiles_.computed += c.computed;
    tiles_.skipped += c.skipped;
  }
}

void CpuBackend::attention_block_backward(const double* dout, const double* q, const double* k,
                                          const double* v, const double* out, const double* lse,
                                          const AttentionBlock& block, bool document_masking,
                                          const AttentionDropout& dropout, const AttentionShape& s,
                                          double* dq, double* dk, double* dv) {
  const int64_t Tq = s.seq, Tk = block.key_seq, D = s.head_dim,
                queries_per_group = s.num_heads / s.num_kv_heads;
  const bool added = mask_form() == MaskForm::kAllowedAdded;
  const TileDropout tile_dropout{dropout, dropout_kept_value(dropout.site.probability, rounding_),
                                 block.window_seq};
  const TileDropout* drop = dropout.active() ? &tile_dropout : nullptr;
  cpu::ThreadScratch scratch(attention_backward_scratch(s));
  const cpu::SingleThreadedBlas blas;
  // A task's work: its group's heads, each Tq queries against Tk keys, D products each.
  cpu::parallel_for(s.windows * s.num_kv_heads, queries_per_group * Tq * Tk * D, [&](int64_t task) {
    const int64_t g = task % s.num_kv_heads, b = task / s.num_kv_heads;
    const WindowMask mask(block, Tq, b, document_masking, added);
    double* dkg = dk + (b * s.num_kv_heads + g) * Tk * D;  // [Tk,D], summed over the group's heads
    double* dvg = dv + (b * s.num_kv_heads + g) * Tk * D;
    std::fill(dkg, dkg + Tk * D, 0.0);
    std::fill(dvg, dvg + Tk * D, 0.0);
    for (int64_t h = g * queries_per_group; h < (g + 1) * queries_per_group; ++h) {
      const HeadSlice x = head_slice(q, k, v, s, Tk, b, h);
      double* dqh = dq + (b * s.num_heads + h) * Tq * D;
      const double* head_lse = lse + (b * s.num_heads + h) * Tq;
      if (precision() == Precision::kFp64) {
        backward_head<double>(precision(), s, mask, drop, x, Tk, dout, out, head_lse, scratch.slot(), dqh,
                              dkg, dvg);
      } else {
        backward_head<float>(precision(), s, mask, drop, x, Tk, dout, out, head_lse, scratch.slot(), dqh, dkg,
                             dvg);
      }
      round(TensorRole::kActivation, dqh, Tq * D);
    }
    round(TensorRole::kActivation, dkg, Tk * D);
    round(TensorRole::kActivation, dvg, Tk * D);
  });
}

}  // namespace touchstone
