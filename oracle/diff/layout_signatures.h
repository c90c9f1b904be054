// The signatures of a tensor stored or sharded in the wrong layout (signatures.h lists every signature):
//   qkv_layout  a linear_qkv tensor equals the golden one with its rows in [q; k; v] order, or read that
//               way and regrouped per KV group;
//   tp_shard    the failing elements of each failing sharded tensor lie in one tensor-parallel shard
//               (parallel/tensor/sharding.h's layout) and cover at least half of it.
#pragma once

#include <vector>

#include "oracle/diff/signatures.h"

namespace touchstone::diff {

std::vector<Verdict> qkv_layout(const GoldenReader& golden, Judge& judge, const TensorMap& candidate,
                                const Group& group);
// tp_sizes: the tensor-parallel sizes to try, largest first wins; empty: 2, 4 and 8.
std::vector<Verdict> tp_shard(const GoldenReader& golden, Judge& judge, const TensorMap& candidate,
                              const Group& group, const std::vector<int>& tp_sizes);

}  // namespace touchstone::diff
