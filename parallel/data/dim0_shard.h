// FSDP2's per-parameter sharding (torch.distributed.fsdp.fully_shard): each tensor a rank holds, of
// local shape [d0, d1, ...], is cut along dim 0 into dp chunks of c = ceil(d0 / dp) rows, torch.chunk's
// sizes. Data-parallel rank r holds rows [r c, min((r + 1) c, d0)), padded with zero rows to c rows, so
// every rank's shard has the same length and one all-gather or reduce-scatter over dp moves a tensor.
// Trailing ranks may hold padding only (d0 = 5 over dp 4: rows 2, 2, 1 and 0).
//
// Padding stays zero by construction: the reduce-scatter of zero-padded gradients gives zero there, and
// AdamW on a zero parameter with a zero gradient leaves it zero.
#pragma once

#include <cstdint>
#include <vector>

#include "model/param_table.h"
#include "parallel/comm/process_group.h"
#include "parallel/shard_plan.h"

namespace touchstone {

class Dim0Shard {
 public:
  Dim0Shard(const std::vector<int64_t>& local_shape, int dp_size);

  int64_t shard_numel() const { return chunk_rows_ * row_numel_; }  // c x d1 x ...
  int64_t full_numel() const { return rows_ * row_numel_; }         // d0 x d1 x ...
  // Elements of rank r's shard that are rows of the tensor (the rest is padding).
  int64_t valid_numel(int rank) const;
  Shape shard_shape() const;  // [c, d1, ...], for the trace

  // Rank r's padded shard of a full tensor [full_numel].
  std::vector<double> take(const std::vector<double>& full, int rank) const;
  // full[full_numel] <- the dp ranks' shards, one all-gather over dp.
  void all_gather(ProcessGroup& dp, const std::vector<double>& shard, std::vector<double>& full) const;
  // shard[shard_numel] += this rank's chunk of the sum over dp of full[full_numel], one reduce-scatter.
  void reduce_scatter_add(ProcessGroup& dp, const std::vector<double>& full,
                          std::vector<double>& shard) const;

 private:
  std::vector<int64_t> local_shape_;
  int64_t rows_ = 0, row_numel_ = 1, chunk_rows_ = 0;
  int dp_size_ = 1;
};

// One Dim0Shard per parameter id of the plan's table; a tensor this rank does not hold has none (0 rows).
std::vector<Dim0Shard> dim0_shards(const ShardPlan& plan, int dp_size);
// A zero shard of every held tensor (tensors not held stay empty).
ParamTensors zero_shards(const std::vector<Dim0Shard>& shards);
// Each held tensor's shard on dp rank `rank`; tensors not held stay empty.
ParamTensors take_shards(const std::vector<Dim0Shard>& shards, const ParamTensors& full, int rank);

}  // namespace touchstone
