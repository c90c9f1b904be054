// The training step of one rank, and the single-process objective used by tests and tools.
#include "oracle/train_step.h"

#include <algorithm>

#include "parallel/comm/message_tags.h"
#include "parallel/finalize_model_grads.h"
#include "parallel/pipeline/executor.h"

namespace touchstone {

namespace {

// `context` with dp_cp in the role of dp (Trainer::reduce_context_); `context` itself without context
// parallelism, where the two groups hold the same ranks (so traces and counters keep naming "dp").
ParallelContext with_dp_cp_as_dp(const ParallelContext& c) {
  if (c.cp.size() == 1) return c;
  return ParallelContext{c.world, c.tp,        c.cp,    c.dp_cp,  c.dp_cp,
                         c.pp,    c.embedding, c.trace, c.layout, c.coordinates};
}

// The optimizer's copy of the weights: FP32 master weights unless FP64.
ParamTensors master_weights(ParamTensors params, Backend& backend) {
  for (auto& t : params.tensors) backend.round(TensorRole::kState, t.data(), static_cast<int64_t>(t.size()));
  return params;
}

}  // namespace

LossScaling loss_scaling(const GlobalBatch& batch, const std::vector<int64_t>& starts,
                         int64_t micro_batch_size, int64_t global_loss_tokens,
                         LossNormalization normalization) {
  // A micro-batch (or global batch) without loss tokens divides by 1, as Megatron-LM does.
  LossScaling s;
  if (normalization == LossNormalization::kGlobalTokenMean) {
    s.grad_scale = 1.0 / static_cast<double>(std::max<int64_t>(global_loss_tokens, 1));
    s.loss_weights.assign(starts.size(), s.grad_scale);
    s.backward_weights.assign(starts.size(), 1.0);
    return s;
  }
  const double num_micro_batches = static_cast<double>(batch.windows / micro_batch_size);
  for (int64_t start : starts) {
    s.loss_weights.push_back(
        1.0 / (static_cast<double>(std::max<int64_t>(batch.loss_tokens(start, micro_batch_size), 1)) *
               num_micro_batches));
  }
  s.backward_weights = s.loss_weights;
  return s;
}

ObjectiveResult evaluate_objective(const Transformer& model, const ParamTable& table,
                                   const ParamTensors& params, const GlobalBatch& batch,
                                   int64_t micro_batch_size, LossNormalization normalization,
                                   bool with_gradients, const GlobalBatch* counts_from) {
  SingleProcessContext single;
  const std::vector<int64_t> starts = micro_batch_starts(batch.windows, micro_batch_size, 1, 0);
  ObjectiveResult result;
  result.num_loss_tokens = batch.loss_tokens(0, batch.windows);
  std::vector<MicroBatch> micro_batches;
  for (int64_t start : starts) micro_batches.push_back(batch.micro_batch(start, micro_batch_size));
  if (with_gradients) result.grads = ParamTensors::zeros_like(table);
  const GlobalBatch& counted = counts_from != nullptr ? *counts_from : batch;
  const LossScaling scaling =
      loss_scaling(counted, starts, micro_batch_size, counted.loss_tokens(0, counted.windows), normalization);
  const PipelineResult run = run_pipeline(PipelineSchedule::kOneForwardOneBackward, {&model}, params,
                                          micro_batches, scaling.loss_weights, scaling.backward_weights,
                                          single.context(), 0, with_gradients, result.grads, nullptr);
  for (auto& g : result.grads.tensors)
    scale_gradient(model.backend(), scaling.grad_scale, g.data(), static_cast<int64_t>(g.size()));
  result.loss = run.weighted_loss;
  for (const auto& losses : run.token_losses)
    result.token_losses.insert(result.token_losses.end(), losses.begin(), losses.end());
  return result;
}

Trainer::Trainer(const Config& config, const ParamTensors& full_initial_params, Backend& backend,
                 const ParallelContext& context)
    : config_(config),
      backend_(backend),
      context_(context),
      reduce_context_(with_dp_cp_as_dp(context)),
      cp_attention_(config.parallel.cp > 1 ? std::make_unique<ContextParallelAttention>(
                                                 context.cp, config.parallel.cp_comm, backend)
                                           : nullptr),
      table_(config.model),
      plan_(table_, config, context.tp.rank(), context.tp.size(), context.stage()),
      dim0_(dim0_shards(plan_, reduce_context_.dp.size())),
      region_(context.tp, config.parallel.sequence_parallel, backend),
      params_(held_params(master_weights(plan_.shard(full_initial_params), backend))),
      timeline_(context.stage()) {
  if (cp_attention_ != nullptr) cp_attention_->set_transfer_observer(&cp_transfers_);
  chunks_.reserve(plan_.chunk_ranges().size());  // chunk_pointers_ point into it: no reallocation
  for (const StageRange& range : plan_.chunk_ranges()) {
    chunks_.emplace_back(config.model, config.data.document_masking, config.train.seed, table_, backend,
                         region_, range, cp_attention_.get());
    chunk_pointers_.push_back(&chunks_.back());
  }
  if (config.parallel.zero() == 3) {
    fully_sharded_ = std::make_unique<FullyShardedParameters>(table_, dim0_, reduce_context_.dp, backend);
    for (Transformer& chunk : chunks_) chunk.set_parameter_hooks(fully_sharded_.get());
  }
  optimizer_ = std::make_unique<DataParallelOptimizer>(plan_, config.optim, config.parallel.zero(), dim0_,
                                                       reduce_context_, backend, params_);
}

ParamTensors Trainer::held_params(ParamTensors local) const {
  if (config_.parallel.zero() != 3) return local;
  return take_shards(dim0_, local, reduce_context_.dp.rank());
}

const ParamTensors& Trainer::params() const {
  if (config_.parallel.zero() != 3) return params_;
  gathered_params_ = ParamTensors();
  gathered_params_.tensors.resize(params_.tensors.size());
  const TransferSite site(reduce_context_.dp,
                          "FSDP: all-gather of full parameters from their shards (outputs)");
  for (int id : plan_.held_ids())
    dim0_[static_cast<size_t>(id)].all_gather(reduce_context_.dp, params_[id], gathered_params_[id]);
  return gathered_params_;
}

void Trainer::restore(int64_t step, const ParamTensors& full_params, const ParamTensors& full_exp_avg,
                      const ParamTensors& full_exp_avg_sq) {
  // Stored master weights are already in the optimizer's precision: sharding copies them unchanged.
  params_ = held_params(plan_.shard(full_params));
  optimizer_->restore(AdamWState{plan_.shard(full_exp_avg), plan_.shard(full_exp_avg_sq), step});
  steps_done_ = step;
}

std::vector<MicroBatch> Trainer::micro_batches(const GlobalBatch& batch, const std::vector<int64_t>& starts,
                                               std::vector<ContextMicroBatch>& rows) const {
  const int64_t mbs = config_.train.micro_batch_size;
  std::vector<MicroBatch> batches;
  if (cp_attention_ == nullptr) {
    for (int64_t start : starts) batches.push_back(batch.micro_batch(start, mbs));
    return batches;
  }
  const LoadBalancedSplit split(batch.seq, context_.cp.size());
  for (int64_t start : starts)
    rows.push_back(batch.context_micro_batch(start, mbs, split, context_.cp.rank()));
  for (const ContextMicroBatch& r : rows) batches.push_back(r.batch);
  return batches;
}

std::vector<double> Trainer::gather_token_losses(const GlobalBatch& batch,
                                                 const std::vector<std::vector<double>>& losses) const {
  const int last = context_.pp.size() - 1, dp = context_.dp.size(), cp = context_.cp.size();
  const int64_t T = batch.seq, mbs = config_.train.micro_batch_size;
  // Every cp rank of the last stage's tp rank 0 sends the losses of its rows; rank 0 puts each row at
  // its position (LoadBalancedSplit; all positions in order without context parallelism).
  const LoadBalancedSplit split(T, cp);
  const int64_t rows = split.local_seq();
  const bool source = context_.last_stage() && context_.tp.rank() == 0;
  const TransferSite site(context_.world, "outputs: token losses to world rank 0");
  std::vector<double> mine;
  for (const auto& l : losses) mine.insert(mine.end(), l.begin(), l.end());
  if (source && context_.world.rank() != 0) {
    context_.world.send(mine.data(), static_cast<int64_t>(mine.size()), 0, message_tags::kTokenLosses,
                        {static_cast<int64_t>(mine.size())});
    context_.world.wait_sends();
  }
  if (context_.world.rank() != 0) return {};
  std::vector<double> all(static_cast<size_t>(batch.windows * T), 0.0);
  for (int r = 0; r < dp; ++r) {
    const std::vector<int64_t> their_starts = micro_batch_starts(batch.windows, mbs, dp, r);
    for (int c = 0; c < cp; ++c) {
      std::vector<double> theirs(static_cast<size_t>(static_cast<int64_t>(their_starts.size()) * mbs * rows));
      const int from = context_.global_rank_of(0, r, last, c);
      if (from == 0) {
        theirs = mine;
      } else {
        context_.world.recv(theirs.data(), static_cast<int64_t>(theirs.size()), from,
                            message_tags::kTokenLosses, {static_cast<int64_t>(theirs.size())});
      }
      const std::vector<int32_t> positions = split.positions(c);
      size_t next = 0;
      for (int64_t start : their_starts) {
        for (int64_t w = start; w < start + mbs; ++w) {
          for (int32_t p : positions) all[static_cast<size_t>(w * T + p)] = theirs[next++];
        }
      }
    }
  }
  return all;
}

StepRecord Trainer::step(const GlobalBatch& batch, bool collect_outputs) {
  StepRecord record;
  record.step = ++steps_done_;
  const int64_t mbs = config_.train.micro_batch_size;
  const std::vector<int64_t> starts =
      micro_batch_starts(batch.windows, mbs, context_.dp.size(), context_.dp.rank());

  std::vector<ContextMicroBatch> context_rows;  // with context parallelism: this rank's rows
  const std::vector<MicroBatch> micro_batches = this->micro_batches(batch, starts, context_rows);

  // The global loss-token count: every rank counts the tokens of its own rows (its micro-batches' windows,
  // or with context parallelism its chunks of them), summed over dp x cp (Megatron-LM's dp_cp group).
  context_.set_phase(record.step, -1, "loss tokens");
  int64_t loss_tokens = 0;
  const int64_t rows = mbs * batch.seq / context_.cp.size();
  for (const MicroBatch& m : micro_batches) {
    for (int64_t i = 0; i < rows; ++i) loss_tokens += m.targets[i] != data::kIgnoreTarget;
  }
  {
    ProcessGroup& group = reduce_context_.dp;  // dp x cp
    const TransferSite site(group, "loss-token count: all-reduce of each rank's count over dp x cp");
    group.all_reduce_sum(&loss_tokens, 1);
  }
  record.num_loss_tokens = loss_tokens;

  gathered_params_ = ParamTensors();
  // Zero stage 3: the passes fill each unit's gradient shards; other stages accumulate full tensors.
  record.grads = fully_sharded_ ? zero_shards(dim0_) : plan_.zeros();
  // The weights the passes use: the BF16 copy of the FP32 master weights in BF16 mode (in FP32 and FP64
  // mode the weights themselves, without a copy).
  ParamTensors bf16_copy;
  if (backend_.options().precision == Precision::kBf16) {
    bf16_copy = params_;
    for (auto& t : bf16_copy.tensors)
      backend_.round(TensorRole::kComputeWeight, t.data(), static_cast<int64_t>(t.size()));
  }
  // The timeline holds this step only: events nobody collected are dropped, so a long run stays bounded.
  timeline_.take_events();
  timeline_.reset_origin();
  const LossScaling scaling = loss_scaling(batch, starts, mbs, loss_tokens, config_.train.loss_normalization);
  // The passes' and the optimizer's buffers come from the arena (common/activation_arena.h); the run's
  // last step lays out no block for a step that will not come.
  const bool last_update = record.step >= config_.train.steps;
  const ActivationArena::Step arena_step(arena_.get(), !last_update);
  const ParamTensors& weights = bf16_copy.tensors.empty() ? params_ : bf16_copy;
  if (fully_sharded_) fully_sharded_->begin_step(weights, record.grads);
  const PipelineResult run = run_pipeline(
      config_.parallel.schedule, chunk_pointers_, fully_sharded_ ? fully_sharded_->params() : weights,
      micro_batches, scaling.loss_weights, scaling.backward_weights, context_, record.step, true,
      fully_sharded_ ? fully_sharded_->grads() : record.grads, &timeline_);
  if (fully_sharded_) fully_sharded_->end_step();

  // The objective: the last stage's tp rank 0 of every dp rank holds a partial sum.
  context_.set_phase(record.step, -1, "loss");
  record.loss = context_.last_stage() && context_.tp.rank() == 0 ? run.weighted_loss : 0.0;
  {
    const TransferSite site(context_.world, "loss: all-reduce of the last stages' weighted sums");
    context_.world.all_reduce_sum(&record.loss, 1, {1});
  }
  if (collect_outputs) record.token_losses = gather_token_losses(batch, run.token_losses);

  context_.set_phase(record.step, -1, "grads");
  finalize_model_grads(plan_, context_, config_.parallel.sequence_parallel, config_.model.tie_embeddings,
                       backend_, record.grads);
  context_.set_phase(record.step, -1, "optimizer");
  const UpdateResult update = optimizer_->step(record.step, record.grads, params_, collect_outputs,
                                               scaling.grad_scale, !(last_update && drop_final_moments_));
  record.grad_norm = update.grad_norm;
  record.clip_coefficient = update.clip_coefficient;
  record.lr = update.lr;
  return record;
}

}  // namespace touchstone
