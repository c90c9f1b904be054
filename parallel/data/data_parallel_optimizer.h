// The optimizer side of a step on one rank of the grid: data-parallel gradient reduction, the global
// gradient norm (every parameter counted exactly once over all ranks), clipping and AdamW.
//
// Four modes (parallel.zero_stage), each giving the single-rank result:
//   0 replicated (default)  all-reduce the flat gradient over dp; every dp rank holds full Adam moments
//                           for its tensors and applies the same update.
//   1 distributed optimizer ZeRO-1: reduce-scatter the flat gradient, so dp rank r holds the summed
//                           gradient of chunk r only; it keeps Adam moments for that chunk, updates
//                           that chunk of the parameters, and an all-gather over dp returns the
//                           updated parameters to every replica.
//   2 sharded gradients     ZeRO-2: each tensor's gradient is reduce-scattered into its dim-0 shard
//                           (parallel/data/dim0_shard.h, FSDP2's sharding) and the full gradient freed;
//                           AdamW updates the shard, an all-gather per tensor returns the parameters.
//   3 sharded parameters    ZeRO-3 / FSDP2: parameters and gradients arrive as dim-0 shards (the passes
//                           gathered and reduce-scattered them per unit, parallel/data/
//                           fully_sharded_parameters.h); AdamW updates the shards, nothing is gathered.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "kernels/backend.h"
#include "optim/optimizer.h"
#include "parallel/comm/context.h"
#include "parallel/data/dim0_shard.h"
#include "parallel/data/flat_buffer.h"
#include "parallel/shard_plan.h"

namespace touchstone {

// g[0..n) *= scale in the main gradients' precision, as Megatron-LM's scale_gradients(1.0 / num_tokens):
// the scale is an FP32 scalar and each product is rounded to FP32 (plain doubles in FP64 mode).
void scale_gradient(Backend& backend, double scale, double* g, int64_t n);

struct UpdateResult {
  double grad_norm = 0.0;  // global, before clipping
  double clip_coefficient = 1.0;
  double lr = 0.0;
};

class DataParallelOptimizer {
 public:
  // `shards`: each tensor's dim-0 shard over dp (zero stages 2 and 3; outlives the optimizer).
  DataParallelOptimizer(const ShardPlan& plan, const OptimConfig& optim, int64_t zero_stage,
                        const std::vector<Dim0Shard>& shards, const ParallelContext& context,
                        Backend& backend, const ParamTensors& params);

  // `grads` holds this rank's accumulated gradients (zero stage 3: this rank's shards of their sum over
  // dp; `params` are then shards too). On return it holds the gradients summed over dp and multiplied by
  // `grad_scale` (full tensors), except with a sharding stage and `want_full_grads` false: then `grads`
  // holds whatever the reduction left (own gradients at stage 1, nothing at stage 2, shards at stage 3),
  // which saves the all-gather a step without outputs does not need. The norm, clipping and update see
  // the scaled, reduced gradients either way.
  // `keep_moments` false: nothing reads the moments after this update (the last of a run that saves no
  // optimizer state). Moments start at zero and are allocated by the first update that keeps them, so
  // a run whose only update keeps none never holds them (2 x 8 bytes per parameter; docs/planning.md).
  UpdateResult step(int64_t update, ParamTensors& grads, ParamTensors& params, bool want_full_grads,
                    double grad_scale = 1.0, bool keep_moments = true);

  // Adam moments shaped like the full tensors this rank holds (gathered over dp when sharded); zeros
  // before the first update. std::logic_error after an update that kept none.
  AdamWState moments() const;
  // Continues from a checkpoint: `moments` shaped like the full tensors this rank holds (each dp rank
  // keeps its own chunk or shards when sharded), after `moments.step` updates.
  void restore(const AdamWState& moments);

 private:
  // Stage 0 after the all-reduce, one pass over the flat gradient: rounded to the main gradients'
  // precision, scaled (scale_gradient), copied back into `grads`, and the squares of the elements this
  // rank counts summed (global_grad_norm's order). Returns that partial sum.
  double unflatten_scaled(const ActivationBuffer& flat, double grad_scale, ParamTensors& grads) const;
  // Stage 1: the partial sum of squares of [begin, end) of the flat gradient.
  double partial_sum_of_squares(const ActivationBuffer& flat_grads, int64_t begin, int64_t end) const;
  // The global gradient norm from every rank's partial sum of squares (one world all-reduce).
  double global_grad_norm(double partial_sum_of_squares) const;
  void hold_moments();  // allocates zero moments unless they are held
  // Stages 2 and 3: scale, norm, clip and AdamW on each tensor's dim-0 shard.
  void sharded_update(ParamTensors& grad_shards, ParamTensors& param_shards, double grad_scale,
                      UpdateResult& result);
  ParamTensors gather_shards(const ParamTensors& shards) const;  // full tensors from dim-0 shards

  const ShardPlan& plan_;
  OptimConfig optim_;
  int64_t zero_stage_;
  const std::vector<Dim0Shard>& shards_;
  ParallelContext context_;
  Backend& backend_;
  FlatBuffer flat_;
  AdamWState state_;                       // stage 0: shaped like the params; 2, 3: like their shards
  std::vector<double> chunk_m_, chunk_v_;  // distributed mode: this dp rank's chunk of the moments
  bool moments_held_ = false;              // state_ or chunk_m_/chunk_v_ allocated
  bool dropped_moments_ = false;           // the last update formed its moments in scratch only
  int64_t steps_done_ = 0;
};

}  // namespace touchstone
