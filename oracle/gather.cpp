// Gathering shards to world rank 0 over point-to-point transfers, one tag per parameter.
#include "oracle/gather.h"

#include "parallel/comm/message_tags.h"
#include "parallel/tensor/sharding.h"

namespace touchstone {

ParamTensors gather_full_tensors(const ShardPlan& plan, const ParallelContext& context,
                                 const ParamTensors& local) {
  const ParamTable& table = plan.table();
  // Replicas over dp and cp hold the same tensors: dp rank 0, cp rank 0 sends.
  const bool sender = context.dp.rank() == 0 && context.cp.rank() == 0 && context.world.rank() != 0;
  const TransferSite site(context.world, "outputs: parameter shards to world rank 0");
  if (sender) {
    for (int id : plan.held_ids()) {
      if (!plan.is_primary(id)) continue;
      context.world.send(local[id].data(), static_cast<int64_t>(local[id].size()), 0,
                         message_tags::parameter(id), plan.local_shape(id));
    }
    context.world.wait_sends();
  }
  if (context.world.rank() != 0) return {};

  ParamTensors full = ParamTensors::zeros_like(table);
  const int tp = context.tp.size();
  for (int id = 0; id < table.size(); ++id) {
    const ParamSpec& spec = table[id];
    const int owners = spec.sharding == Sharding::kReplicated ? 1 : tp;
    for (int r = 0; r < owners; ++r) {
      const int from = context.global_rank_of(r, 0, plan.owner_stage(id));
      if (from == 0) {
        place_shard(spec.sharding, spec.shape, local[id], r, tp, full[id]);
        continue;
      }
      std::vector<double> shard(static_cast<size_t>(plan.local_numel(id)));
      context.world.recv(shard.data(), static_cast<int64_t>(shard.size()), from, message_tags::parameter(id),
                         plan.local_shape(id));
      place_shard(spec.sharding, spec.shape, shard, r, tp, full[id]);
    }
  }
  return full;
}

}  // namespace touchstone
