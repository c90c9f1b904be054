// ZeRO-3 / FSDP2 (parallel.zero_stage = 3): every parameter lives on this rank as its dim-0 shard
// (parallel/data/dim0_shard.h) only. The model's hooks (model/transformer.h, ParameterHooks) make each
// unit's full tensors just in time and drop them right after:
//
//   before_forward(unit)    all-gather the unit's parameters over dp          (FSDP2's pre-forward hook)
//   after_forward(unit)     free them                                         (reshard after forward)
//   before_backward(unit)   all-gather them again, zero the unit's gradients  (pre-backward hook)
//   after_backward(unit)    reduce-scatter the unit's gradients over dp, adding this rank's chunk into
//                           its gradient shard; free parameters and gradients (post-backward hook)
//
// So a rank holds at most the tensors of the units in flight at once, plus shards of everything. The
// gradient of each micro-batch is reduce-scattered when its unit's backward ends, as FSDP2 does with
// gradient synchronisation on; the shard sums the micro-batches in the order their backwards run.
//
// Under ZB-H1 a unit's backward (B) leaves its weight gradients to a later W, so its gradients outlive
// after_backward: the parameters are freed there (W reads none), the gradients stay and count one
// pending W per micro-batch; before_backward of a later micro-batch adds into the same buffers (W keeps
// pointers into them). after_weight_gradients takes one pending W off each of the unit's tensors, and
// the last one reduce-scatters the sum of those micro-batches and frees it. A tensor two units share
// (the tied embedding and output layer on one stage) counts both units' W.
#pragma once

#include <vector>

#include "kernels/backend.h"
#include "model/param_table.h"
#include "model/transformer.h"
#include "parallel/comm/process_group.h"
#include "parallel/data/dim0_shard.h"

namespace touchstone {

class FullyShardedParameters final : public ParameterHooks {
 public:
  FullyShardedParameters(const ParamTable& table, const std::vector<Dim0Shard>& shards, ProcessGroup& dp,
                         Backend& backend);

  // One step's passes: the model computes with the tensors gathered from `compute_shards` (the BF16
  // copy of the master shards in BF16 mode) and each unit's gradient is added into `grad_shards`.
  // Both must outlive the passes.
  void begin_step(const ParamTensors& compute_shards, ParamTensors& grad_shards);
  // Throws std::logic_error when a unit's tensors are still gathered: a hook pair did not match.
  void end_step();

  // What the passes read and write: only the running units' tensors are present (others empty).
  const ParamTensors& params() const { return params_; }
  ParamTensors& grads() { return grads_; }

  void before_forward(const ParameterUnit& unit) override;
  void after_forward(const ParameterUnit& unit) override;
  void before_backward(const ParameterUnit& unit) override;
  void after_backward(const ParameterUnit& unit, bool weight_gradients_deferred) override;
  void after_weight_gradients(const ParameterUnit& unit) override;

 private:
  std::vector<int> ids_of(const ParameterUnit& unit) const;
  void gather(const ParameterUnit& unit);
  void free_params(const ParameterUnit& unit);
  // Adds this rank's chunk of grads_[id], summed over dp, into its gradient shard and frees grads_[id].
  void reduce_scatter(int id);

  const ParamTable& table_;
  const std::vector<Dim0Shard>& shards_;
  ProcessGroup& dp_;
  Backend& backend_;
  const ParamTensors* compute_shards_ = nullptr;
  ParamTensors* grad_shards_ = nullptr;
  ParamTensors params_, grads_;       // full local tensors of the units in flight
  std::vector<int> pending_weights_;  // per tensor: deferred W that will still add into grads_[id]
};

}  // namespace touchstone
