// The layout's gradient reductions (parallel/finalize_model_grads.h).
#include "parallel/finalize_model_grads.h"

namespace touchstone {

namespace {
// The trace shape of a gradient: its local shape, or flat when it is a dim-0 shard (zero stage 3).
Shape shape_of(const ShardPlan& plan, int id, const std::vector<double>& g) {
  if (static_cast<int64_t>(g.size()) == plan.local_numel(id)) return plan.local_shape(id);
  return {static_cast<int64_t>(g.size())};
}
}  // namespace

void finalize_model_grads(const ShardPlan& plan, const ParallelContext& context, bool sequence_parallel,
                          bool tie_embeddings, Backend& backend, ParamTensors& grads) {
  const ParamTable& table = plan.table();
  if (sequence_parallel) {
    for (int id : plan.held_ids()) {
      if (table[id].sharding != Sharding::kReplicated) continue;
      const TransferSite site(context.tp, "finalize_model_grads: all-reduce of the sequence-parallel " +
                                              table[id].name + " gradient over tp");
      context.tp.all_reduce_sum(grads[id].data(), static_cast<int64_t>(grads[id].size()),
                                shape_of(plan, id, grads[id]));
      backend.round(TensorRole::kState, grads[id].data(), static_cast<int64_t>(grads[id].size()));
    }
  }
  if (tie_embeddings && context.pp.size() > 1 && plan.holds(table.embedding())) {
    std::vector<double>& g = grads[table.embedding()];
    const TransferSite site(
        context.embedding,
        "finalize_model_grads: all-reduce of the tied embedding's gradient (first and last stage)");
    context.embedding.all_reduce_sum(g.data(), static_cast<int64_t>(g.size()),
                                     shape_of(plan, table.embedding(), g));
    backend.round(TensorRole::kState, g.data(), static_cast<int64_t>(g.size()));
  }
}

}  // namespace touchstone
