// Dim-0 shards of one tensor over data-parallel ranks, and the two collectives that move them.
#include "parallel/data/dim0_shard.h"

#include <algorithm>

namespace touchstone {

Dim0Shard::Dim0Shard(const std::vector<int64_t>& local_shape, int dp_size)
    : local_shape_(local_shape), dp_size_(dp_size) {
  rows_ = local_shape.empty() ? 0 : local_shape[0];
  for (size_t d = 1; d < local_shape.size(); ++d) row_numel_ *= local_shape[d];
  chunk_rows_ = (rows_ + dp_size - 1) / dp_size;
}

int64_t Dim0Shard::valid_numel(int rank) const {
  return std::clamp<int64_t>(rows_ - rank * chunk_rows_, 0, chunk_rows_) * row_numel_;
}

Shape Dim0Shard::shard_shape() const {
  Shape shape = local_shape_;
  if (!shape.empty()) shape[0] = chunk_rows_;
  return shape;
}

std::vector<double> Dim0Shard::take(const std::vector<double>& full, int rank) const {
  std::vector<double> shard(static_cast<size_t>(shard_numel()), 0.0);
  if (valid_numel(rank) > 0)
    std::copy_n(full.begin() + rank * shard_numel(), valid_numel(rank), shard.begin());
  return shard;
}

void Dim0Shard::all_gather(ProcessGroup& dp, const std::vector<double>& shard,
                           std::vector<double>& full) const {
  // Gathered into a padded buffer [dp x c, ...], of which the first d0 rows are the tensor.
  std::vector<double> padded(static_cast<size_t>(dp_size_ * shard_numel()));
  dp.all_gather(shard.data(), padded.data(), shard_numel(), shard_shape());
  padded.resize(static_cast<size_t>(full_numel()));
  full = std::move(padded);
}

void Dim0Shard::reduce_scatter_add(ProcessGroup& dp, const std::vector<double>& full,
                                   std::vector<double>& shard) const {
  std::vector<double> padded(static_cast<size_t>(dp_size_ * shard_numel()), 0.0);
  std::copy(full.begin(), full.end(), padded.begin());
  std::vector<double> mine(static_cast<size_t>(shard_numel()));
  dp.reduce_scatter_sum(padded.data(), mine.data(), shard_numel(), shard_shape());
  for (size_t i = 0; i < mine.size(); ++i) shard[i] += mine[i];
}

std::vector<Dim0Shard> dim0_shards(const ShardPlan& plan, int dp_size) {
  std::vector<Dim0Shard> shards;
  for (int id = 0; id < plan.table().size(); ++id) {
    shards.emplace_back(plan.holds(id) ? plan.local_shape(id) : std::vector<int64_t>{0}, dp_size);
  }
  return shards;
}

ParamTensors zero_shards(const std::vector<Dim0Shard>& shards) {
  ParamTensors out;
  for (const Dim0Shard& s : shards) out.tensors.emplace_back(static_cast<size_t>(s.shard_numel()), 0.0);
  return out;
}

ParamTensors take_shards(const std::vector<Dim0Shard>& shards, const ParamTensors& full, int rank) {
  ParamTensors out;
  out.tensors.resize(full.tensors.size());
  for (size_t id = 0; id < full.tensors.size(); ++id) {
    if (!full.tensors[id].empty()) out.tensors[id] = shards[id].take(full.tensors[id], rank);
  }
  return out;
}

}  // namespace touchstone
