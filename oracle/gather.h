// Full tensors from sharded state: every rank that holds the primary shard of a tensor (ShardPlan)
// sends it to world rank 0, which places the shards into full tensors in the contract's layouts. Golden
// files (and any dump) are written from these, whatever the layout that produced them.
#pragma once

#include "model/param_table.h"
#include "parallel/comm/context.h"
#include "parallel/shard_plan.h"

namespace touchstone {

// Collective over the world group. Returns full tensors on world rank 0, an empty set elsewhere.
// Only data-parallel rank 0 sends: the replicas hold the same shards.
ParamTensors gather_full_tensors(const ShardPlan& plan, const ParallelContext& context,
                                 const ParamTensors& local);

}  // namespace touchstone
