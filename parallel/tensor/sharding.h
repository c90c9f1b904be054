// Tensor-parallel shards of full parameters: which part of each tensor tp rank r holds, and the
// conversions between full tensors (the contract's layouts) and shards. Init, golden files and
// checkpoints all go through these two functions, so a layout rule lives in one place.
#pragma once

#include <cstdint>
#include <vector>

namespace touchstone {

// How tensor parallelism splits a tensor over the tp ranks (Megatron-Core's layouts). The parameter
// table (model/param_table.h) names the rule of every parameter.
enum class Sharding {
  kReplicated,  // norm weights: every tp rank holds the whole tensor
  kRows,        // dim 0 in tp equal contiguous blocks: vocab rows of the embedding and output layer
                // (VocabParallelEmbedding, vocab-parallel output), whole KV groups of linear_qkv
  kGateUp,      // linear_fc1: rank r holds [gate rows of r; up rows of r] (not a contiguous block)
  kColumns,     // dim 1 in tp contiguous blocks: linear_proj and linear_fc2 (RowParallelLinear)
};

// Shape of tp rank r's shard of a tensor of `full_shape` (the same on every rank).
std::vector<int64_t> shard_shape(Sharding rule, const std::vector<int64_t>& full_shape, int tp_size);

// The shard of tp rank `tp_rank` cut out of a full tensor.
std::vector<double> shard_of(Sharding rule, const std::vector<int64_t>& full_shape,
                             const std::vector<double>& full, int tp_rank, int tp_size);

// Writes rank `tp_rank`'s shard into its place in a full tensor.
void place_shard(Sharding rule, const std::vector<int64_t>& full_shape, const std::vector<double>& shard,
                 int tp_rank, int tp_size, std::vector<double>& full);

}  // namespace touchstone
