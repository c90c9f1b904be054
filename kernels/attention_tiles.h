// The tiles of attention: which keys each query of a window sees, and which (query tile, key tile)
// pairs can hold a visible key at all, for every backend's attention kernels and the host-side count
// they report (Backend::attention_tiles).
//
// A pair is skipped when every key of the key tile lies after every query of the query tile
// (causality, on positions in the window), or, with document masking, when the ranges of document ids
// of the two tiles do not meet. The range test never skips a pair holding a visible key, whatever the ids; on
// packed data, where ids grow along the window, it skips exactly the pairs no document spans, so the work
// grows with the sum of squared document lengths instead of T^2.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/backend.h"

namespace touchstone {

// Queries and keys per tile: a [64,64] tile of scores and its companions stay in the L2 cache.
constexpr int64_t kAttentionTile = 64;

// The whole window as one block: every window's positions 0..T-1, for queries and keys alike
// (Backend::attention_forward). Holds the positions it points to.
struct WholeWindowBlock {
  std::vector<int32_t> positions;  // [b*T]
  AttentionBlock block;
  WholeWindowBlock(const int32_t* document_ids, int64_t windows, int64_t seq)
      : positions(static_cast<size_t>(windows * seq)) {
    for (int64_t w = 0; w < windows; ++w)
      std::iota(positions.begin() + w * seq, positions.begin() + (w + 1) * seq, 0);
    block = AttentionBlock{seq, seq, positions.data(), document_ids, positions.data(), document_ids};
  }
};

// The mask of one window of one attention call (a whole window, or a block of it: AttentionBlock),
// over its Tq query rows and Tk key rows, each with its position in the window and its document id
// (the document ids may be null when document_masking is off).
class WindowMask {
 public:
  // Window w of `block`, whose calls have query_seq = Tq rows per window; `added`: the scores see every
  // key and gain 1 where the rule allows (CpuBackend::MaskForm::kAllowedAdded), so no pair is skipped.
  WindowMask(const AttentionBlock& block, int64_t query_seq, int64_t w, bool document_masking, bool added)
      : q_pos_(block.query_positions + w * query_seq),
        q_docs_(block.query_document_ids == nullptr ? nullptr : block.query_document_ids + w * query_seq),
        k_pos_(block.key_positions + w * block.key_seq),
        k_docs_(block.key_document_ids == nullptr ? nullptr : block.key_document_ids + w * block.key_seq),
        q_seq_(query_seq),
        k_seq_(block.key_seq),
        masking_(document_masking),
        added_(added),
        q_ranges_(ranges(q_pos_, q_docs_, q_seq_)),
        k_ranges_(ranges(k_pos_, k_docs_, k_seq_)) {}

  int64_t query_rows() const { return q_seq_; }  // Tq
  int64_t key_rows() const { return k_seq_; }    // Tk
  int64_t query_tiles() const { return (q_seq_ + kAttentionTile - 1) / kAttentionTile; }
  int64_t key_tiles() const { return (k_seq_ + kAttentionTile - 1) / kAttentionTile; }
  // The rule of attention_forward, on positions in the window: causal, and within one document when
  // masking. i indexes the call's query rows, j its key rows.
  bool allowed(int64_t i, int64_t j) const {
    return k_pos_[j] <= q_pos_[i] && (!masking_ || k_docs_[j] == q_docs_[i]);
  }
  // Positions in the window of query row i and key row j (they key the attention dropout mask).
  int64_t query_position(int64_t i) const { return q_pos_[i]; }
  int64_t key_position(int64_t j) const { return k_pos_[j]; }
  // Whether the scores see key j at all (every key of the window when the 0/1 mask was added instead).
  bool visible(int64_t i, int64_t j) const { return added_ || allowed(i, j); }
  // What the scores gain: 1 where allowed under the added 0/1 mask, else nothing.
  double bias(int64_t i, int64_t j) const { return added_ && allowed(i, j) ? 1.0 : 0.0; }
  // Whether query tile qt and key tile kt can hold a visible pair: not when every key lies after every
  // query, nor (masking) when the two tiles' document-id ranges do not meet. For a whole window
  // (positions 0..T-1 on both sides) the first test is kt > qt.
  bool tile_needed(int64_t qt, int64_t kt) const {
    if (added_) return true;
    const TileRange& q = q_ranges_[static_cast<size_t>(qt)];
    const TileRange& k = k_ranges_[static_cast<size_t>(kt)];
    if (k.min_position > q.max_position) return false;
    if (!masking_) return true;
    return k.max_doc >= q.min_doc && k.min_doc <= q.max_doc;
  }
  // Whether every query of tile qt sees every key of tile kt with nothing added to its score: every key
  // at or before every query, all of one document (when masking), and no 0/1 mask added. The kernels
  // then skip the per-pair test, which gives the same scores.
  bool tile_unmasked(int64_t qt, int64_t kt) const {
    if (added_) return false;
    const TileRange& q = q_ranges_[static_cast<size_t>(qt)];
    const TileRange& k = k_ranges_[static_cast<size_t>(kt)];
    if (k.max_position > q.min_position) return false;
    return !masking_ || (q.min_doc == q.max_doc && k.min_doc == k.max_doc && q.min_doc == k.min_doc);
  }
  // The pairs of the window, counted (once per query head).
  AttentionTileCount count() const {
    AttentionTileCount c;
    for (int64_t qt = 0; qt < query_tiles(); ++qt) {
      for (int64_t kt = 0; kt < key_tiles(); ++kt) ++(tile_needed(qt, kt) ? c.computed : c.skipped);
    }
    return c;
  }

 private:
  struct TileRange {
    int32_t min_position, max_position, min_doc, max_doc;
  };
  static std::vector<TileRange> ranges(const int32_t* positions, const int32_t* docs, int64_t seq) {
    std::vector<TileRange> r;
    for (int64_t first = 0; first < seq; first += kAttentionTile) {
      const int64_t n = std::min(kAttentionTile, seq - first);
      const auto [pos_low, pos_high] = std::minmax_element(positions + first, positions + first + n);
      if (docs == nullptr) {  // no document ids: only causality masks (document_masking is off)
        r.push_back({*pos_low, *pos_high, 0, 0});
        continue;
      }
      const auto [doc_low, doc_high] = std::minmax_element(docs + first, docs + first + n);
      r.push_back({*pos_low, *pos_high, *doc_low, *doc_high});
    }
    return r;
  }

  const int32_t *q_pos_, *q_docs_, *k_pos_, *k_docs_;
  int64_t q_seq_, k_seq_;
  bool masking_, added_;
  std::vector<TileRange> q_ranges_, k_ranges_;  // [tiles] of each side
};

}  // namespace touchstone
