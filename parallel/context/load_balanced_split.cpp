// Context parallelism's load-balanced split of a window (load_balanced_split.h).
#include "parallel/context/load_balanced_split.h"

#include <stdexcept>
#include <string>

#include "common/config.h"

namespace touchstone {

LoadBalancedSplit::LoadBalancedSplit(int64_t seq, int cp) : seq_(seq), cp_(cp) {
  // cp = 1 cuts nothing (common/config.h's rule): the window is one block, of any length.
  if (cp < 1 || seq <= 0 || !context_parallel_fits_window(cp, seq)) {
    throw std::invalid_argument("load-balanced split: the window length " + std::to_string(seq) +
                                " must be a positive multiple of 2 x cp = " + std::to_string(2 * cp));
  }
}

std::vector<int32_t> LoadBalancedSplit::positions(int rank) const {
  std::vector<int32_t> p;
  p.reserve(static_cast<size_t>(local_seq()));
  if (cp_ == 1) {  // the whole window in order, whatever its length (two halves would drop an odd one's last)
    for (int64_t i = 0; i < seq_; ++i) p.push_back(static_cast<int32_t>(i));
    return p;
  }
  for (int64_t chunk : {first_chunk(rank), second_chunk(rank)}) {
    for (int64_t i = chunk * chunk_length(); i < (chunk + 1) * chunk_length(); ++i)
      p.push_back(static_cast<int32_t>(i));
  }
  return p;
}

std::vector<int32_t> LoadBalancedSplit::positions(int rank, int64_t windows) const {
  const std::vector<int32_t> one = positions(rank);
  std::vector<int32_t> all;
  all.reserve(static_cast<size_t>(windows * local_seq()));
  for (int64_t w = 0; w < windows; ++w) all.insert(all.end(), one.begin(), one.end());
  return all;
}

std::vector<int32_t> LoadBalancedSplit::take(const int32_t* x, int rank, int64_t windows) const {
  const std::vector<int32_t> mine = positions(rank);
  std::vector<int32_t> rows;
  rows.reserve(static_cast<size_t>(windows * local_seq()));
  for (int64_t w = 0; w < windows; ++w) {
    for (int32_t p : mine) rows.push_back(x[w * seq_ + p]);
  }
  return rows;
}

}  // namespace touchstone
