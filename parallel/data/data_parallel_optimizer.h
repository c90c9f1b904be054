// The optimizer side of a step on one rank of the grid: data-parallel gradient reduction, the global
// gradient norm (every parameter counted exactly once over all ranks), clipping and AdamW.
//
// Two modes, both giving the single-rank result:
//   replicated (default)    all-reduce the flat gradient over dp; every dp rank holds full Adam moments
//                           for its tensors and applies the same update.
//   distributed optimizer   ZeRO-1: reduce-scatter the flat gradient, so dp rank r holds the summed
//                           gradient of chunk r only; it keeps Adam moments for that chunk, updates
//                           that chunk of the parameters, and an all-gather over dp returns the
//                           updated parameters to every replica.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "kernels/backend.h"
#include "optim/optimizer.h"
#include "parallel/comm/context.h"
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
  DataParallelOptimizer(const ShardPlan& plan, const OptimConfig& optim, bool distributed,
                        const ParallelContext& context, Backend& backend, const ParamTensors& params);

  // `grads` holds this rank's accumulated gradients. On return it holds the gradients summed over dp
  // and multiplied by `grad_scale`, except with the distributed optimizer and `want_full_grads` false:
  // then `grads` is left as it came (this rank's own gradients) and the reduced chunk stays internal,
  // which saves the all-gather a step without outputs does not need. The norm, clipping and update see
  // the scaled, reduced gradients either way.
  // `keep_moments` false: nothing reads the moments after this update (the last of a run that saves no
  // optimizer state). Moments start at zero and are allocated by the first update that keeps them, so
  // a run whose only update keeps none never holds them (2 x 8 bytes per parameter; docs/planning.md).
  UpdateResult step(int64_t update, ParamTensors& grads, ParamTensors& params, bool want_full_grads,
                    double grad_scale = 1.0, bool keep_moments = true);

  // Adam moments shaped like the parameters this rank holds (gathered over dp when distributed); zeros
  // before the first update. std::logic_error after an update that kept none.
  AdamWState moments() const;
  // Continues from a checkpoint: `moments` shaped like the parameters this rank holds (each dp rank
  // keeps its own chunk when distributed), after `moments.step` updates.
  void restore(const AdamWState& moments);

 private:
  double global_grad_norm(const ActivationBuffer& flat_grads, int64_t begin, int64_t end) const;
  void hold_moments();  // allocates zero moments unless they are held

  const ShardPlan& plan_;
  OptimConfig optim_;
  bool distributed_;
  ParallelContext context_;
  Backend& backend_;
  FlatBuffer flat_;
  AdamWState state_;                       // replicated mode: shaped like the params
  std::vector<double> chunk_m_, chunk_v_;  // distributed mode: this dp rank's chunk of the moments
  bool moments_held_ = false;              // state_ or chunk_m_/chunk_v_ allocated
  bool dropped_moments_ = false;           // the last update formed its moments in scratch only
  int64_t steps_done_ = 0;
};

}  // namespace touchstone
