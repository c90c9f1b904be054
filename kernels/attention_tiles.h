// The tiles of attention: which keys each query of a window sees, and which (query tile, key tile)
// pairs can hold a visible key at all, for every backend's attention kernels and the host-side count
// they report (Backend::attention_tiles).
//
// A pair is skipped when every key of the key tile lies after every query of the query tile
// (causality), or, with document masking, when the ranges of document ids of the two tiles do not
// meet. The range test never skips a pair holding a visible key, whatever the ids; on packed data,
// where ids grow along the window, it skips exactly the pairs no document spans, so the work grows
// with the sum of squared document lengths instead of T^2.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace touchstone {

// Queries and keys per tile: a [64,64] tile of scores and its companions stay in the L2 cache.
constexpr int64_t kAttentionTile = 64;

class WindowMask {
 public:
  // document_ids[T] of one window; `added`: the scores see every key and gain 1 where the rule allows
  // (CpuBackend::MaskForm::kAllowedAdded), so no pair is skipped.
  WindowMask(const int32_t* document_ids, bool document_masking, bool added, int64_t seq)
      : docs_(document_ids), masking_(document_masking), added_(added), seq_(seq) {
    for (int64_t t = 0; t < tiles() && masking_; ++t) {
      const int32_t* first = docs_ + t * kAttentionTile;
      const auto [low, high] =
          std::minmax_element(first, first + std::min(kAttentionTile, seq - t * kAttentionTile));
      tile_min_.push_back(*low);
      tile_max_.push_back(*high);
    }
  }
  int64_t tiles() const { return (seq_ + kAttentionTile - 1) / kAttentionTile; }
  // The rule of attention_forward: causal, and within one document when masking.
  bool allowed(int64_t i, int64_t j) const { return j <= i && (!masking_ || docs_[j] == docs_[i]); }
  // Whether the scores see key j at all (every key of the window when the 0/1 mask was added instead).
  bool visible(int64_t i, int64_t j) const { return added_ || allowed(i, j); }
  // What the scores gain: 1 where allowed under the added 0/1 mask, else nothing.
  double bias(int64_t i, int64_t j) const { return added_ && allowed(i, j) ? 1.0 : 0.0; }
  // Whether query tile qt and key tile kt can hold a visible pair.
  bool tile_needed(int64_t qt, int64_t kt) const {
    if (added_) return true;
    if (kt > qt) return false;  // every key after every query (both tilings start at position 0)
    if (!masking_) return true;
    return tile_max_[static_cast<size_t>(kt)] >= tile_min_[static_cast<size_t>(qt)] &&
           tile_min_[static_cast<size_t>(kt)] <= tile_max_[static_cast<size_t>(qt)];
  }
  // The pairs of the window, counted (once per query head).
  AttentionTileCount count() const {
    AttentionTileCount c;
    for (int64_t qt = 0; qt < tiles(); ++qt) {
      for (int64_t kt = 0; kt < tiles(); ++kt) ++(tile_needed(qt, kt) ? c.computed : c.skipped);
    }
    return c;
  }

 private:
  const int32_t* docs_;
  bool masking_, added_;
  int64_t seq_;
  std::vector<int32_t> tile_min_, tile_max_;  // [tiles] document-id range of each tile's positions
};

}  // namespace touchstone
