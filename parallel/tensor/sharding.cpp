// Shard <-> full tensor copies for each Sharding rule.
#include "parallel/tensor/sharding.h"

#include <algorithm>

namespace touchstone {

namespace {

// A rectangular block of a row-major [rows, cols] tensor: rows [row0, row0 + nrows), cols [col0, ...).
struct Block {
  int64_t row0, nrows, col0, ncols;
};

// The blocks of the full tensor that rank r holds, in the order they are stacked in its shard.
std::vector<Block> blocks_of(Sharding rule, const std::vector<int64_t>& shape, int r, int t) {
  const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  switch (rule) {
    case Sharding::kReplicated:
      return {{0, rows, 0, cols}};
    case Sharding::kRows:
      return {{r * rows / t, rows / t, 0, cols}};
    case Sharding::kGateUp: {
      const int64_t ffn = rows / 2, local = ffn / t;  // [gate; up] -> [gate_r; up_r]
      return {{r * local, local, 0, cols}, {ffn + r * local, local, 0, cols}};
    }
    case Sharding::kColumns:
      return {{0, rows, r * cols / t, cols / t}};
  }
  return {};
}

template <typename Copy>
void for_each_block_row(Sharding rule, const std::vector<int64_t>& shape, int r, int t, Copy copy) {
  const int64_t cols = shape.size() > 1 ? shape[1] : 1;
  int64_t shard_offset = 0;
  for (const Block& b : blocks_of(rule, shape, r, t)) {
    for (int64_t i = 0; i < b.nrows; ++i) {
      copy((b.row0 + i) * cols + b.col0, shard_offset, b.ncols);
      shard_offset += b.ncols;
    }
  }
}

}  // namespace

std::vector<int64_t> shard_shape(Sharding rule, const std::vector<int64_t>& full_shape, int t) {
  std::vector<int64_t> shape = full_shape;
  if (rule == Sharding::kRows || rule == Sharding::kGateUp) shape[0] /= t;
  if (rule == Sharding::kColumns) shape[1] /= t;
  return shape;
}

std::vector<double> shard_of(Sharding rule, const std::vector<int64_t>& full_shape,
                             const std::vector<double>& full, int r, int t) {
  int64_t numel = 1;
  for (int64_t d : shard_shape(rule, full_shape, t)) numel *= d;
  std::vector<double> shard(static_cast<size_t>(numel));
  for_each_block_row(rule, full_shape, r, t, [&](int64_t full_offset, int64_t shard_offset, int64_t n) {
    std::copy_n(full.begin() + full_offset, n, shard.begin() + shard_offset);
  });
  return shard;
}

void place_shard(Sharding rule, const std::vector<int64_t>& full_shape, const std::vector<double>& shard,
                 int r, int t, std::vector<double>& full) {
  for_each_block_row(rule, full_shape, r, t, [&](int64_t full_offset, int64_t shard_offset, int64_t n) {
    std::copy_n(shard.begin() + shard_offset, n, full.begin() + full_offset);
  });
}

}  // namespace touchstone
