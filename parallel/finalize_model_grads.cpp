// The layout's gradient reductions (parallel/finalize_model_grads.h).
#include "parallel/finalize_model_grads.h"

namespace touchstone {

void finalize_model_grads(const ShardPlan& plan, const ParallelContext& context, bool sequence_parallel,
                          bool tie_embeddings, Backend& backend, ParamTensors& grads) {
  const ParamTable& table = plan.table();
  if (sequence_parallel) {
    for (int id : plan.held_ids()) {
      if (table[id].sharding != Sharding::kReplicated) continue;
      context.tp.all_reduce_sum(grads[id].data(), static_cast<int64_t>(grads[id].size()),
                                plan.local_shape(id));
      backend.round(TensorRole::kState, grads[id].data(), static_cast<int64_t>(grads[id].size()));
    }
  }
  if (tie_embeddings && context.pp.size() > 1 && plan.holds(table.embedding())) {
    std::vector<double>& g = grads[table.embedding()];
    context.embedding.all_reduce_sum(g.data(), static_cast<int64_t>(g.size()),
                                     plan.local_shape(table.embedding()));
    backend.round(TensorRole::kState, g.data(), static_cast<int64_t>(g.size()));
  }
}

}  // namespace touchstone
