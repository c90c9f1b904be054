// Shard <-> full tensor copies for each Sharding rule of the parameter table.
#include "parallel/tensor/sharding.h"

#include <algorithm>

namespace touchstone {

namespace {

// A rectangular block of a row-major [rows, cols] tensor: rows [row0, row0 + nrows), cols [col0, ...).
struct Block {
  int64_t row0, nrows, col0, ncols;
};

// The blocks of the full tensor that rank r holds, in the order they are stacked in its shard.
std::vector<Block> blocks_of(const ParamSpec& spec, int r, int t) {
  const int64_t rows = spec.shape[0], cols = spec.shape.size() > 1 ? spec.shape[1] : 1;
  switch (spec.sharding) {
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
void for_each_block_row(const ParamSpec& spec, int r, int t, Copy copy) {
  const int64_t cols = spec.shape.size() > 1 ? spec.shape[1] : 1;
  int64_t shard_offset = 0;
  for (const Block& b : blocks_of(spec, r, t)) {
    for (int64_t i = 0; i < b.nrows; ++i) {
      copy((b.row0 + i) * cols + b.col0, shard_offset, b.ncols);
      shard_offset += b.ncols;
    }
  }
}

}  // namespace

std::vector<int64_t> shard_shape(const ParamSpec& spec, int t) {
  std::vector<int64_t> shape = spec.shape;
  if (spec.sharding == Sharding::kRows || spec.sharding == Sharding::kGateUp) shape[0] /= t;
  if (spec.sharding == Sharding::kColumns) shape[1] /= t;
  return shape;
}

std::vector<double> shard_of(const ParamSpec& spec, const std::vector<double>& full, int r, int t) {
  int64_t numel = 1;
  for (int64_t d : shard_shape(spec, t)) numel *= d;
  std::vector<double> shard(static_cast<size_t>(numel));
  for_each_block_row(spec, r, t, [&](int64_t full_offset, int64_t shard_offset, int64_t n) {
    std::copy_n(full.begin() + full_offset, n, shard.begin() + shard_offset);
  });
  return shard;
}

void place_shard(const ParamSpec& spec, const std::vector<double>& shard, int r, int t, std::vector<double>& full) {
  for_each_block_row(spec, r, t, [&](int64_t full_offset, int64_t shard_offset, int64_t n) {
    std::copy_n(shard.begin() + shard_offset, n, full.begin() + full_offset);
  });
}

}  // namespace touchstone
