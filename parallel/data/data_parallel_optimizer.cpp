// Data-parallel gradient reduction, global norm, clipping and (optionally sharded) AdamW.
#include "parallel/data/data_parallel_optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace touchstone {

void scale_gradient(Backend& backend, double scale, double* g, int64_t n) {
  if (scale == 1.0) return;
  backend.round(TensorRole::kState, &scale, 1);
  for (int64_t i = 0; i < n; ++i) g[i] *= scale;  // exact in double for FP32 operands; then one rounding
  backend.round(TensorRole::kState, g, n);
}

DataParallelOptimizer::DataParallelOptimizer(const ShardPlan& plan, const OptimConfig& optim,
                                             int64_t zero_stage, const std::vector<Dim0Shard>& shards,
                                             const ParallelContext& context, Backend& backend,
                                             const ParamTensors& params)
    : plan_(plan),
      optim_(optim),
      zero_stage_(zero_stage),
      shards_(shards),
      context_(context),
      backend_(backend),
      flat_(zero_stage <= 1 ? params : ParamTensors{}, context.dp.size()) {}

void DataParallelOptimizer::hold_moments() {
  if (moments_held_) return;
  moments_held_ = true;
  if (zero_stage_ >= 2) {
    state_ = AdamWState{zero_shards(shards_), zero_shards(shards_), steps_done_};
    return;
  }
  if (zero_stage_ == 1) {
    chunk_m_.assign(static_cast<size_t>(flat_.chunk_size()), 0.0);
    chunk_v_ = chunk_m_;
    return;
  }
  ParamTensors zeros = plan_.zeros();
  state_.exp_avg = zeros;
  state_.exp_avg_sq = std::move(zeros);
}

// Each element of the model is counted by exactly one rank: the primary shard of its tensor
// (ShardPlan::is_primary) and, over dp, the rank whose chunk holds it (distributed) or dp rank 0. Every
// partial sum runs over the flat buffer's segments in order, each in element order.
double DataParallelOptimizer::partial_sum_of_squares(const ActivationBuffer& flat_grads, int64_t begin,
                                                     int64_t end) const {
  double partial = 0.0;
  for (const FlatBuffer::Segment& s : flat_.segments()) {
    if (!plan_.is_primary(s.id)) continue;
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    for (int64_t i = lo; i < hi; ++i)
      partial += flat_grads[static_cast<size_t>(i)] * flat_grads[static_cast<size_t>(i)];
  }
  return partial;
}

double DataParallelOptimizer::unflatten_scaled(const ActivationBuffer& flat, double grad_scale,
                                               ParamTensors& grads) const {
  // Block by block: each block is copied into its tensor, then rounded, scaled and summed there while it
  // is in the L1 cache. The bits of one pass of each over the whole buffer (all elementwise but the sum,
  // which keeps its order), for one read of the flat buffer from memory and one write of the tensors.
  constexpr int64_t kBlock = 2048;
  const bool counts = context_.dp.rank() == 0;
  double partial = 0.0;
  for (const FlatBuffer::Segment& s : flat_.segments()) {
    const bool counted = counts && plan_.is_primary(s.id);
    for (int64_t lo = 0; lo < s.numel; lo += kBlock) {
      const int64_t len = std::min(kBlock, s.numel - lo);
      double* block = grads[s.id].data() + lo;
      std::copy_n(flat.data() + s.offset + lo, len, block);
      backend_.round(TensorRole::kState, block, len);  // an FP32 reduction unless FP64
      scale_gradient(backend_, grad_scale, block, len);
      if (counted) {
        for (int64_t i = 0; i < len; ++i) partial += block[i] * block[i];
      }
    }
  }
  return partial;
}

double DataParallelOptimizer::global_grad_norm(double partial_sum_of_squares) const {
  const TransferSite site(context_.world,
                          "optimizer: all-reduce of the gradient norm's partial sums of squares");
  context_.world.all_reduce_sum(&partial_sum_of_squares, 1, {1});
  return std::sqrt(partial_sum_of_squares);
}

UpdateResult DataParallelOptimizer::step(int64_t update, ParamTensors& grads, ParamTensors& params,
                                         bool want_full_grads, double grad_scale, bool keep_moments) {
  // Moments start at zero: they are allocated by the first update that keeps them.
  if (keep_moments) hold_moments();
  dropped_moments_ = !moments_held_;
  const int dp_rank = context_.dp.rank();
  const int64_t chunk = flat_.chunk_size(), begin = dp_rank * chunk, end = begin + chunk;
  ActivationBuffer flat = zero_stage_ <= 1 ? flat_.flatten(grads) : ActivationBuffer();
  UpdateResult result;
  result.lr = learning_rate(optim_, update);
  steps_done_ += 1;

  if (zero_stage_ >= 2) {
    ParamTensors grad_shards;  // stage 2: reduce-scattered here, each full gradient freed once it is
    if (zero_stage_ == 2) {
      grad_shards = zero_shards(shards_);
      for (int id : plan_.held_ids()) {
        const TransferSite site(context_.dp,
                                "ZeRO-2: reduce-scatter of the " + plan_.table()[id].name + " gradient");
        shards_[static_cast<size_t>(id)].reduce_scatter_add(context_.dp, grads[id], grad_shards[id]);
        backend_.round(TensorRole::kState, grad_shards[id].data(),
                       static_cast<int64_t>(grad_shards[id].size()));
        std::vector<double>().swap(grads[id]);
      }
    }
    ParamTensors& g = zero_stage_ == 2 ? grad_shards : grads;
    if (zero_stage_ == 2) {
      ParamTensors param_shards = take_shards(shards_, params, dp_rank);
      sharded_update(g, param_shards, grad_scale, result);
      params = gather_shards(param_shards);
    } else {
      sharded_update(g, params, grad_scale, result);
    }
    if (want_full_grads) grads = gather_shards(g);
    return result;
  }

  if (zero_stage_ == 0) {
    const TransferSite site(context_.dp, "finalize_model_grads: all-reduce of the gradient buffer");
    context_.dp.all_reduce_sum(flat.data(), flat_.padded_size(), {flat_.padded_size()});
    result.grad_norm = global_grad_norm(unflatten_scaled(flat, grad_scale, grads));
    result.clip_coefficient = clip_coefficient(result.grad_norm, optim_.clip_grad);
    adamw_step(backend_, plan_.table(), optim_, result.lr, result.clip_coefficient, grads, params, state_);
    return result;
  }

  ActivationBuffer grad_chunk(static_cast<size_t>(chunk));
  {
    const TransferSite site(context_.dp, "DistributedOptimizer: reduce-scatter of the gradient buffer");
    context_.dp.reduce_scatter_sum(flat.data(), grad_chunk.data(), chunk, {flat_.padded_size()});
  }
  backend_.round(TensorRole::kState, grad_chunk.data(), chunk);
  scale_gradient(backend_, grad_scale, grad_chunk.data(), chunk);
  std::copy(grad_chunk.begin(), grad_chunk.end(), flat.begin() + begin);
  result.grad_norm = global_grad_norm(partial_sum_of_squares(flat, begin, end));
  result.clip_coefficient = clip_coefficient(result.grad_norm, optim_.clip_grad);

  // AdamW on this rank's chunk, one run per tensor overlapping it (weight decay is per tensor).
  ActivationBuffer param_flat = flat_.flatten(params);
  for (const FlatBuffer::Segment& s : flat_.segments()) {
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo >= hi) continue;
    const AdamWStep adam{result.lr,
                         optim_.beta1,
                         optim_.beta2,
                         optim_.eps,
                         plan_.table()[s.id].weight_decay ? optim_.weight_decay : 0.0,
                         steps_done_,
                         result.clip_coefficient};
    const int64_t at = lo - begin;
    adamw_update_in_pieces(backend_, adam, grad_chunk.data() + at, param_flat.data() + lo,
                           moments_held_ ? chunk_m_.data() + at : nullptr,
                           moments_held_ ? chunk_v_.data() + at : nullptr, hi - lo);
  }
  ActivationBuffer updated(static_cast<size_t>(flat_.padded_size()));
  {
    const TransferSite site(context_.dp, "DistributedOptimizer: all-gather of the updated parameters");
    context_.dp.all_gather(param_flat.data() + begin, updated.data(), chunk, {chunk});
  }
  flat_.unflatten(updated, params);

  if (want_full_grads) {  // only for outputs: the replicas' other chunks of the summed gradient
    ActivationBuffer full(static_cast<size_t>(flat_.padded_size()));
    const TransferSite site(context_.dp,
                            "DistributedOptimizer: all-gather of the reduced gradient (outputs)");
    context_.dp.all_gather(grad_chunk.data(), full.data(), chunk, {chunk});
    flat_.unflatten(full, grads);
  }
  return result;
}

void DataParallelOptimizer::sharded_update(ParamTensors& grad_shards, ParamTensors& param_shards,
                                           double grad_scale, UpdateResult& result) {
  double partial = 0.0;  // each element in exactly one shard of one primary tensor; padding is zero
  for (int id : plan_.held_ids()) {
    std::vector<double>& g = grad_shards[id];
    scale_gradient(backend_, grad_scale, g.data(), static_cast<int64_t>(g.size()));
    if (!plan_.is_primary(id)) continue;
    for (double x : g) partial += x * x;
  }
  result.grad_norm = global_grad_norm(partial);
  result.clip_coefficient = clip_coefficient(result.grad_norm, optim_.clip_grad);
  // adamw_step counts updates in state_.step; without kept moments state_ has no tensors.
  state_.step = steps_done_ - 1;
  adamw_step(backend_, plan_.table(), optim_, result.lr, result.clip_coefficient, grad_shards, param_shards,
             state_);
}

ParamTensors DataParallelOptimizer::gather_shards(const ParamTensors& shards) const {
  ParamTensors full;  // each gathered tensor is the all-gather's own buffer
  full.tensors.resize(shards.tensors.size());
  const TransferSite site(context_.dp, "ZeRO: all-gather of full tensors from their dim-0 shards (outputs)");
  for (int id : plan_.held_ids()) {
    shards_[static_cast<size_t>(id)].all_gather(context_.dp, shards[id], full[id]);
  }
  return full;
}

AdamWState DataParallelOptimizer::moments() const {
  if (dropped_moments_) {
    throw std::logic_error("update " + std::to_string(steps_done_) +
                           " was told its AdamW moments are read by nobody: they were not kept");
  }
  if (!moments_held_) {  // no update yet: the moments are zero
    AdamWState zeros{plan_.zeros(), plan_.zeros(), steps_done_};
    return zeros;
  }
  if (zero_stage_ == 0) return state_;
  if (zero_stage_ >= 2)
    return AdamWState{gather_shards(state_.exp_avg), gather_shards(state_.exp_avg_sq), steps_done_};
  AdamWState state = state_;
  ParamTensors shapes = plan_.zeros();
  state.exp_avg = shapes;
  state.exp_avg_sq = shapes;
  const int64_t chunk = flat_.chunk_size();
  ActivationBuffer full(static_cast<size_t>(flat_.padded_size()));
  const TransferSite site(context_.dp, "DistributedOptimizer: all-gather of the Adam moments (outputs)");
  context_.dp.all_gather(chunk_m_.data(), full.data(), chunk, {chunk});
  flat_.unflatten(full, state.exp_avg);
  context_.dp.all_gather(chunk_v_.data(), full.data(), chunk, {chunk});
  flat_.unflatten(full, state.exp_avg_sq);
  state.step = steps_done_;
  return state;
}

void DataParallelOptimizer::restore(const AdamWState& moments) {
  steps_done_ = moments.step;
  hold_moments();
  dropped_moments_ = false;
  if (zero_stage_ == 0) {
    state_ = moments;
    return;
  }
  if (zero_stage_ >= 2) {
    const int dp_rank = context_.dp.rank();
    state_ = AdamWState{take_shards(shards_, moments.exp_avg, dp_rank),
                        take_shards(shards_, moments.exp_avg_sq, dp_rank), moments.step};
    return;
  }
  const int64_t chunk = flat_.chunk_size(), begin = context_.dp.rank() * chunk;
  const ActivationBuffer m = flat_.flatten(moments.exp_avg), v = flat_.flatten(moments.exp_avg_sq);
  std::copy_n(m.begin() + begin, chunk, chunk_m_.begin());
  std::copy_n(v.begin() + begin, chunk, chunk_v_.begin());
}

}  // namespace touchstone
