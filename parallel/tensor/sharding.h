// Tensor-parallel shards of full parameters: which part of each tensor tp rank r holds, and the
// conversions between full tensors (the contract's layouts) and shards. Init, golden files and
// checkpoints all go through these two functions, so a layout rule lives in one place.
#pragma once

#include <cstdint>
#include <vector>

#include "model/param_table.h"

namespace touchstone {

// Shape of tp rank r's shard (the same on every rank).
std::vector<int64_t> shard_shape(const ParamSpec& spec, int tp_size);

// The shard of tp rank `tp_rank` cut out of a full tensor.
std::vector<double> shard_of(const ParamSpec& spec, const std::vector<double>& full, int tp_rank, int tp_size);

// Writes rank `tp_rank`'s shard into its place in a full tensor.
void place_shard(const ParamSpec& spec, const std::vector<double>& shard, int tp_rank, int tp_size,
                 std::vector<double>& full);

}  // namespace touchstone
