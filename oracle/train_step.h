// One training step on one rank of the grid, in the order of docs/architecture.md: this data-parallel rank's
// micro-batches (Megatron-LM's sampler order) -> the pipeline schedule (forward/backward with gradient
// accumulation) -> finalize gradients (sequence-parallel norm weights, tied embedding) -> data-parallel
// reduction, global norm, clipping, AdamW (parallel/data/data_parallel_optimizer.h). With one rank it
// is the plain single-process step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "data/sampler_order.h"  // micro_batch_starts: Megatron-LM's sampler order
#include "kernels/backend.h"
#include "model/param_table.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "oracle/global_batch.h"
#include "parallel/comm/context.h"
#include "parallel/data/data_parallel_optimizer.h"
#include "parallel/data/fully_sharded_parameters.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/timeline.h"
#include "parallel/shard_plan.h"
#include "parallel/tensor/regions.h"

namespace touchstone {

// How the normalization (LossNormalization, common/options.h) enters one step, where Megatron-LM
// applies it (docs/precision.md):
// - global_token_mean (--calculate-per-token-loss): each micro-batch back-propagates its plain loss sum
//   (weight 1), and the summed main gradients are multiplied by 1/num_loss_tokens after the dp reduction
//   (finalize_model_grads), in the main gradients' precision;
// - per_microbatch_mean: the loss is divided by its token count and the number of micro-batches before
//   the backward, so that weight multiplies the cross entropy gradient of each micro-batch.
// In exact arithmetic loss_weights[j] == backward_weights[j] * grad_scale for every micro-batch j.
struct LossScaling {
  std::vector<double> loss_weights;      // d(objective) / d(token loss), per micro-batch of `starts`
  std::vector<double> backward_weights;  // the weight each micro-batch's backward starts from
  double grad_scale = 1.0;               // multiplies the summed gradients (after the dp reduction)
};
LossScaling loss_scaling(const GlobalBatch& batch, const std::vector<int64_t>& starts,
                         int64_t micro_batch_size, int64_t global_loss_tokens,
                         LossNormalization normalization);

// The objective of one global batch on one process (no grid), and optionally its gradient.
struct ObjectiveResult {
  double loss = 0.0;                 // the objective whose gradient is `grads`
  int64_t num_loss_tokens = 0;       // whole global batch
  std::vector<double> token_losses;  // [B*T] cross entropy per position, 0 where no loss
  ParamTensors grads;                // empty unless requested
};
// `counts_from` (optional): the batch whose loss-token counts the normalization divides by (the global
// count, or each micro-batch's), in place of `batch`'s own: the token losses of `batch` normalised by
// another batch's counts. num_loss_tokens stays `batch`'s.
ObjectiveResult evaluate_objective(const Transformer& model, const ParamTable& table,
                                   const ParamTensors& params, const GlobalBatch& batch,
                                   int64_t micro_batch_size, LossNormalization normalization,
                                   bool with_gradients, const GlobalBatch* counts_from = nullptr);

struct StepRecord {
  int64_t step = 0;                  // 1-based update number
  double loss = 0.0;                 // the objective (every rank)
  int64_t num_loss_tokens = 0;       // whole global batch (every rank)
  std::vector<double> token_losses;  // [B*T], on world rank 0 only, when outputs are collected
  ParamTensors grads;                // this rank's shards, summed over dp, before clipping
  double grad_norm = 0.0;            // before clipping
  double clip_coefficient = 1.0;
  double lr = 0.0;
};

// Owns one rank's parameter shards and optimizer state.
class Trainer {
 public:
  Trainer(const Config& config, const ParamTensors& full_initial_params, Backend& backend,
          const ParallelContext& context);
  Trainer(const Trainer&) = delete;  // members refer to each other
  Trainer& operator=(const Trainer&) = delete;

  // `collect_outputs`: gather the token losses to world rank 0 and keep the whole dp-summed gradient
  // on every replica, for golden files; a plain training step does neither.
  StepRecord step(const GlobalBatch& batch, bool collect_outputs = true);

  // Continues after `step` updates from full master weights and moments (a checkpoint, any layout).
  void restore(int64_t step, const ParamTensors& full_params, const ParamTensors& full_exp_avg,
               const ParamTensors& full_exp_avg_sq);
  int64_t steps_done() const { return steps_done_; }
  // Nothing reads the optimizer state after the run's last update (train.steps): no checkpoint, no
  // moments in the golden file. That update then keeps no AdamW moments (a one-step run never holds
  // them), and optimizer_moments() after it throws std::logic_error.
  void drop_final_moments() { drop_final_moments_ = true; }

  const ParamTable& table() const { return table_; }
  const ShardPlan& plan() const { return plan_; }
  // The master weights of the tensors this rank holds, full shapes: with zero_stage 3 gathered over dp
  // (a collective: every rank calls it) into a copy kept until the next step or call.
  const ParamTensors& params() const;
  AdamWState optimizer_moments() const { return optimizer_->moments(); }
  // This stage's model chunks: one Transformer each (one without virtual stages).
  const ModelChunks& chunks() const { return chunk_pointers_; }
  pipeline::TimelineRecorder& timeline() { return timeline_; }
  // The passes' buffers: from the second step on, one block laid out after the first (docs/planning.md).
  const ActivationArena& arena() const { return *arena_; }

 private:
  // The master weights as this rank keeps them: `local` itself, or its dim-0 shards at zero stage 3.
  ParamTensors held_params(ParamTensors local) const;
  // The token losses of the whole global batch [B*T] on world rank 0 (empty elsewhere).
  std::vector<double> gather_token_losses(const GlobalBatch& batch,
                                          const std::vector<std::vector<double>>& losses) const;

  // This rank's micro-batches of the step: views into the global batch, or with context parallelism
  // its rows of them, kept in `rows`.
  std::vector<MicroBatch> micro_batches(const GlobalBatch& batch, const std::vector<int64_t>& starts,
                                        std::vector<ContextMicroBatch>& rows) const;

  Config config_;
  Backend& backend_;
  ParallelContext context_;
  // The gradient reductions' view: context_ with the dp_cp group as its dp group, since the cp ranks'
  // gradients are partial sums over their tokens as the dp replicas' are over their micro-batches
  // (the optimizer, ZeRO's shards and the gathers of zero stage 3 all reduce over dp x cp).
  ParallelContext reduce_context_;
  std::unique_ptr<ContextParallelAttention> cp_attention_;  // parallel.cp > 1
  ParamTable table_;
  ShardPlan plan_;
  std::vector<Dim0Shard> dim0_;  // each held tensor's shard over dp (zero stages 2 and 3)
  TensorParallelRegion region_;
  std::vector<Transformer> chunks_;  // one per model chunk of plan_.chunk_ranges()
  ModelChunks chunk_pointers_;       // into chunks_, for the executor
  ParamTensors params_;  // master weights: full local tensors, or their dim-0 shards at zero stage 3
  mutable ParamTensors gathered_params_;  // zero stage 3: params() of the last call, until the next step
  std::unique_ptr<FullyShardedParameters> fully_sharded_;  // zero stage 3: the model's parameter hooks
  std::unique_ptr<DataParallelOptimizer> optimizer_;
  pipeline::TimelineRecorder timeline_;
  // Draws the attention's context-parallel transfers on timeline_, within the forward or backward they
  // serve (pipeline::ActionKind::kContextTransfer).
  class ContextTransfersOnTimeline final : public ContextTransferObserver {
   public:
    explicit ContextTransfersOnTimeline(pipeline::TimelineRecorder& timeline) : timeline_(timeline) {}
    void transfer_begins() override {
      within_ = timeline_.open();  // only inside a recorded forward or backward
      if (within_) timeline_.begin_within(pipeline::ActionKind::kContextTransfer);
    }
    void transfer_ends() override {
      if (within_) timeline_.end_within();
      within_ = false;
    }

   private:
    pipeline::TimelineRecorder& timeline_;
    bool within_ = false;
  };
  ContextTransfersOnTimeline cp_transfers_{timeline_};
  std::unique_ptr<ActivationArena> arena_ = std::make_unique<ActivationArena>();
  int64_t steps_done_ = 0;
  bool drop_final_moments_ = false;
};

}  // namespace touchstone
