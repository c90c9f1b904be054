// Just-in-time all-gather of each unit's parameters and reduce-scatter of its gradients (ZeRO-3).
#include "parallel/data/fully_sharded_parameters.h"

#include <stdexcept>
#include <string>

namespace touchstone {

namespace {
void free_tensor(std::vector<double>& t) { std::vector<double>().swap(t); }
}  // namespace

FullyShardedParameters::FullyShardedParameters(const ParamTable& table, const std::vector<Dim0Shard>& shards,
                                               ProcessGroup& dp, Backend& backend)
    : table_(table), shards_(shards), dp_(dp), backend_(backend) {
  params_.tensors.resize(static_cast<size_t>(table.size()));
  grads_.tensors.resize(static_cast<size_t>(table.size()));
  pending_weights_.assign(static_cast<size_t>(table.size()), 0);
}

void FullyShardedParameters::begin_step(const ParamTensors& compute_shards, ParamTensors& grad_shards) {
  compute_shards_ = &compute_shards;
  grad_shards_ = &grad_shards;
}

void FullyShardedParameters::end_step() {
  for (int id = 0; id < table_.size(); ++id) {
    if (!params_[id].empty() || !grads_[id].empty()) {
      throw std::logic_error("fully sharded parameters: " + table_[id].name +
                             " is still gathered after the step's passes");
    }
  }
  compute_shards_ = nullptr;
  grad_shards_ = nullptr;
}

std::vector<int> FullyShardedParameters::ids_of(const ParameterUnit& unit) const {
  switch (unit.kind) {
    case ParameterUnit::Kind::kEmbedding:
      return {table_.embedding()};
    case ParameterUnit::Kind::kHead:
      return {table_.final_norm(), table_.output()};
    case ParameterUnit::Kind::kLayer:
      break;
  }
  const LayerParamIds& l = table_.layer(unit.layer);
  return {l.input_norm, l.qkv, l.proj, l.pre_mlp_norm, l.fc1, l.fc2};
}

void FullyShardedParameters::gather(const ParameterUnit& unit) {
  for (int id : ids_of(unit)) {
    const TransferSite site(dp_, "FSDP: all-gather of " + table_[id].name + " before its unit runs");
    shards_[static_cast<size_t>(id)].all_gather(dp_, (*compute_shards_)[id], params_[id]);
  }
}

void FullyShardedParameters::free_params(const ParameterUnit& unit) {
  for (int id : ids_of(unit)) free_tensor(params_[id]);
}

void FullyShardedParameters::before_forward(const ParameterUnit& unit) { gather(unit); }

void FullyShardedParameters::after_forward(const ParameterUnit& unit) { free_params(unit); }

void FullyShardedParameters::before_backward(const ParameterUnit& unit) {
  gather(unit);
  for (int id : ids_of(unit)) {
    // Still there while a deferred W of an earlier micro-batch will add into it: never reallocate.
    if (pending_weights_[static_cast<size_t>(id)] > 0) continue;
    grads_[id].assign(static_cast<size_t>(shards_[static_cast<size_t>(id)].full_numel()), 0.0);
  }
}

void FullyShardedParameters::after_backward(const ParameterUnit& unit, bool weight_gradients_deferred) {
  for (int id : ids_of(unit)) {
    if (weight_gradients_deferred) {
      ++pending_weights_[static_cast<size_t>(id)];
    } else if (pending_weights_[static_cast<size_t>(id)] == 0) {
      reduce_scatter(id);
    }
  }
  free_params(unit);
}

void FullyShardedParameters::after_weight_gradients(const ParameterUnit& unit) {
  for (int id : ids_of(unit)) {
    int& pending = pending_weights_[static_cast<size_t>(id)];
    if (pending == 0) {
      throw std::logic_error("fully sharded parameters: a W of " + table_[id].name +
                             " ran without a deferred backward before it");
    }
    if (--pending == 0) reduce_scatter(id);
  }
}

void FullyShardedParameters::reduce_scatter(int id) {
  std::vector<double>& shard = (*grad_shards_)[id];
  const TransferSite site(dp_, "FSDP: reduce-scatter of the " + table_[id].name + " gradient");
  shards_[static_cast<size_t>(id)].reduce_scatter_add(dp_, grads_[id], shard);
  backend_.round(TensorRole::kState, shard.data(),
                 static_cast<int64_t>(shard.size()));  // FP32 main gradients
  free_tensor(grads_[id]);
}

}  // namespace touchstone
