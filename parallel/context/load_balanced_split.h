// Context parallelism's split of a window over the cp ranks (Megatron-LM's causal load balancing).
//
// A window of T positions is cut into 2 cp chunks of T / (2 cp); cp rank r holds chunks r and
// 2cp - 1 - r. Under causal attention a query's work grows with its position, so pairing an early
// chunk with a late one gives every rank the same number of (query, key) pairs:
//
//   cp = 2, T = 8:   positions  0 1 | 2 3 | 4 5 | 6 7
//                    chunk        0     1     2     3
//                    rank         0     1     1     0     rank 0 holds 0 1 6 7, rank 1 holds 2 3 4 5
//
// A rank's rows are its two chunks in ascending position order; tokens, targets, position ids and
// document ids travel with their rows, so document masking and per-document RoPE positions hold
// across chunk boundaries.
#pragma once

#include <cstdint>
#include <vector>

namespace touchstone {

class LoadBalancedSplit {
 public:
  // Throws std::invalid_argument unless cp >= 1 and T is a positive multiple of 2 cp, or cp = 1 and T
  // any positive length (context_parallel_fits_window; the config's check, docs/config.md, reports it
  // to the user first). At cp = 1 rank 0 holds the whole window in order.
  LoadBalancedSplit(int64_t seq, int cp);

  int64_t seq() const { return seq_; }
  int cp() const { return cp_; }
  int64_t chunk_length() const { return seq_ / (2 * cp_); }  // T / (2 cp)
  int64_t local_seq() const { return seq_ / cp_; }           // rows per window on one rank

  // The two chunks of rank r: r and 2cp - 1 - r.
  int64_t first_chunk(int rank) const { return rank; }
  int64_t second_chunk(int rank) const { return 2 * cp_ - 1 - rank; }
  // Positions in the window of rank r's rows, ascending: [local_seq].
  std::vector<int32_t> positions(int rank) const;
  // The same for `windows` windows one after another: [windows * local_seq].
  std::vector<int32_t> positions(int rank, int64_t windows) const;
  // Rank r's rows of a per-position array of `windows` windows: x[windows * T] -> [windows * local_seq].
  std::vector<int32_t> take(const int32_t* x, int rank, int64_t windows) const;

 private:
  int64_t seq_;
  int cp_;
};

}  // namespace touchstone
