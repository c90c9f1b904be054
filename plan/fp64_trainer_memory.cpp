// Allocation replay of training steps of Touchstone's FP64 trainer on one rank: the executor's walk
// through the pipeline schedule, the loss and token-loss gather, the gradient finalization and the
// optimizer update, in the order of the code (the passes themselves are in fp64_pass_replay.cpp, the
// communication layer's buffers in comm_staging.cpp).
#include "plan/fp64_trainer_memory.h"

#include <algorithm>
#include <stdexcept>

#include "optim/optimizer.h"
#include "parallel/pipeline/schedule.h"
#include "plan/comm_staging.h"
#include "plan/fp64_pass_replay.h"

namespace touchstone::plan {

namespace {

using pipeline::ActionKind;

// The communication buffers of each of the rank's groups (parallel/comm/grid.h: the embedding group joins
// the first and the last stage; gradients are reduced over dp_cp, which is the dp group when cp = 1).
struct Groups {
  GroupScratch tp, dp, cp, world, embedding;
  SendCopies pp_sends, cp_sends, world_sends;
  Groups(BufferTally& l, const Fp64Rank& r)
      : tp(l, "tp", r.tp),
        dp(l, r.cp > 1 ? "dp_cp" : "dp", r.dp_cp()),
        cp(l, "cp", r.cp),
        world(l, "world", r.tp * r.cp * r.dp * r.pp),
        embedding(l, "embedding", r.pp > 1 && (r.stage == 0 || r.stage == r.pp - 1) ? 2 : 1),
        pp_sends(l, "pp", r.send_completion),
        cp_sends(l, "cp", r.send_completion),
        world_sends(l, "world", r.send_completion) {}
};

class StepReplay {
 public:
  explicit StepReplay(const Fp64Rank& rank) : r_(rank), d_(dims_of(rank)), groups_(l_, rank) {}

  Fp64StepReplay run() {
    Fp64StepReplay result;
    step(&result);
    result.in_flight = pipeline::peak_in_flight(schedule());
    result.stored_at_peak = stored_at_peak_;
    if (r_.moments_dropped) {  // a run of one step: no second step, no arena block
      result.peak = l_.peak();
      return result;
    }
    PeakSnapshot first = l_.peak();
    l_.reset_peak();
    step(nullptr);
    result.peak = l_.peak();
    if (first.at.bytes > result.peak.at.bytes) {
      result.peak = first;
      result.peak.at.name = "first step, " + first.at.name;
    }
    return result;
  }

 private:
  // The executor's list (parallel/pipeline/executor.cpp stage_actions).
  std::vector<pipeline::Action> schedule() const {
    const auto pp = static_cast<int>(r_.pp), stage = static_cast<int>(r_.stage),
               m = static_cast<int>(r_.micro_batches);
    if (r_.chunks.size() > 1)
      return pipeline::build_interleaved_schedule(pp, static_cast<int>(r_.chunks.size()), stage, m);
    return pipeline::build_schedule(r_.schedule, pp, stage, m);
  }
  bool last_stage() const { return r_.stage == r_.pp - 1; }
  double token_losses_per_rank() const { return static_cast<double>(r_.micro_batches) * d_.N; }

  void step(Fp64StepReplay* breakdown);
  std::vector<int> pipeline(Fp64StepReplay* breakdown);
  int gather_token_losses();
  void finalize_grads();
  void optimizer_update();
  std::vector<int> step_gradients();
  void sharded_update(std::vector<int>& grads);
  void adamw_pieces(double elements);

  BufferTally l_;
  const Fp64Rank& r_;
  Dims d_;
  Groups groups_;
  double stored_at_peak_ = 0;
};

// parallel/pipeline/executor.cpp: the schedule's actions in order. Received inputs live through their
// forward, received gradients through their backward; input gradients until the executor returns; the
// pipeline's last chunk copies each micro-batch's token losses into the result, which lives until the
// step ends. Buffers are per (chunk, micro-batch), as the executor's. Returns those token-loss records.
std::vector<int> StepReplay::pipeline(Fp64StepReplay* breakdown) {
  PassReplay pass(l_, r_, {groups_.tp, groups_.dp, groups_.cp, groups_.cp_sends});
  const auto m = static_cast<size_t>(r_.micro_batches), n = r_.chunks.size() * m;
  std::vector<PassStored> acts(n);
  std::vector<int> inputs(n, -1), d_outputs(n, -1), d_inputs(n, -1), token_records;
  std::vector<DeferredReplay> deferred(n);   // what each split backward's W keeps
  std::vector<double> stored_bytes(n, 0.0);  // of each set, from its forward to its backward
  int64_t stored = 0;
  double live = 0;
  for (const pipeline::Action& action : schedule()) {
    const auto j = static_cast<size_t>(action.micro_batch), k = static_cast<size_t>(action.chunk) * m + j;
    const Fp64Chunk& chunk = r_.chunks[static_cast<size_t>(action.chunk)];
    const std::string micro_batch = "micro-batch " + std::to_string(j);
    const bool forward_kind = action.kind == ActionKind::kForward ||
                              action.kind == ActionKind::kRecvActivation ||
                              action.kind == ActionKind::kSendActivation;
    l_.context(r_.chunks.size() > 1 ? micro_batch + ", chunk " + std::to_string(action.chunk) : micro_batch);
    l_.at(forward_kind ? "forward" : "backward");
    switch (action.kind) {
      case ActionKind::kRecvActivation:
        inputs[k] = l_.alloc(d_.Nl * d_.H, "received activation");
        break;
      case ActionKind::kForward: {
        const bool named = breakdown && k == 0;  // the first chunk's first micro-batch
        acts[k] = pass.forward(chunk, named ? breakdown : nullptr);
        for (int h : acts[k].all) stored_bytes[k] += l_.bytes(h);
        if (named) breakdown->stored_per_micro_batch = stored_bytes[k];
        stored_at_peak_ = std::max(stored_at_peak_, live += stored_bytes[k]);
        if (inputs[k] >= 0) l_.release(inputs[k]);
        l_.set_stored_micro_batches(++stored);
        if (chunk.last) token_records.push_back(l_.alloc_outside_arena(d_.N, "token-loss record"));
        break;
      }
      case ActionKind::kSendActivation:
        groups_.pp_sends.send(d_.Nl * d_.H, "activation of " + micro_batch);
        break;
      case ActionKind::kRecvGradient:
        d_outputs[k] = l_.alloc(d_.Nl * d_.H, "received gradient");
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        d_inputs[k] =
            pass.backward(chunk, acts[k], action.kind == ActionKind::kBackwardInput ? &deferred[k] : nullptr);
        l_.release(acts[k].all);  // what the backward left
        l_.set_stored_micro_batches(--stored);
        live -= stored_bytes[k];
        if (d_outputs[k] >= 0) l_.release(d_outputs[k]);
        break;
      case ActionKind::kBackwardWeight:
        pass.backward_weights(deferred[k]);
        break;
      case ActionKind::kSendGradient:
        groups_.pp_sends.send(d_.Nl * d_.H, "gradient of " + micro_batch);
        break;
      case ActionKind::kContextTransfer:  // recorded within attention, never scheduled
        throw std::logic_error("memory replay: a schedule holds a context-parallel transfer");
    }
  }
  l_.context("");
  l_.at("end of the pipeline");
  groups_.pp_sends.wait_sends();
  for (int h : d_inputs) {
    if (h >= 0) l_.release(h);
  }
  return token_records;
}

// Trainer::gather_token_losses: every last-stage rank concatenates its token losses; its tp rank 0 sends
// them to world rank 0, which assembles the global batch, receiving the losses of one (dp, cp) rank at a
// time.
// Returns the handle of the assembled losses (the step's record keeps them), or -1.
int StepReplay::gather_token_losses() {
  l_.at("token-loss gather");
  // `mine` grows by one micro-batch's losses at a time, by std::vector's doubling.
  int mine = -1;
  double size = 0, capacity = 0;
  for (int64_t j = 0; last_stage() && j < r_.micro_batches; ++j) {
    if (size + d_.N > capacity) {
      capacity = size + std::max(size, d_.N);
      const int grown = l_.alloc_outside_arena(capacity, "token losses of this rank");
      if (mine >= 0) l_.release(mine);
      mine = grown;
    }
    size += d_.N;
  }
  if (last_stage() && r_.tp_rank == 0 && !r_.world_rank_zero()) {
    groups_.world_sends.send(size, "token losses");
    groups_.world_sends.wait_sends();
  }
  int all = -1;
  if (r_.world_rank_zero()) {
    all = l_.alloc_outside_arena(token_losses_per_rank() * static_cast<double>(r_.dp_cp()),
                                 "token losses of the global batch");
    for (int64_t from = 0; from < r_.dp_cp(); ++from) {
      l_.release(l_.alloc_outside_arena(token_losses_per_rank(), "token losses of one dp (and cp) rank"));
    }
  }
  if (mine >= 0) l_.release(mine);
  return all;
}

// Trainer::finalize_grads: with sequence parallelism every norm weight's gradient is summed over tp; a
// tied embedding's gradient over the embedding group.
void StepReplay::finalize_grads() {
  l_.at("finalize gradients");
  for (const HeldTensor& t : r_.held) {
    const double n = r_.zero_stage == 3 ? r_.shard(t) : t.numel;  // stage 3 reduces the shards
    if (r_.sequence_parallel && t.replicated) groups_.tp.all_reduce_sum(n);
    if (r_.shape.tied_embeddings && r_.pp > 1 && t.embedding) groups_.embedding.all_reduce_sum(n);
  }
}

// optim/optimizer.cpp adamw_update_in_pieces on `elements`: nothing beside the model state when the
// moments are kept; otherwise one piece's moments, formed in scratch.
void StepReplay::adamw_pieces(double elements) {
  if (!r_.moments_dropped) return;
  const double piece = std::min(elements, static_cast<double>(kAdamWPiece));
  const int exp_avg = l_.alloc_outside_arena(piece, "exp_avg piece");
  const int exp_avg_sq = l_.alloc_outside_arena(piece, "exp_avg_sq piece");
  l_.release({exp_avg, exp_avg_sq});
}

// parallel/data/data_parallel_optimizer.cpp: the flat gradient, then either the all-reduce over dp and
// AdamW per tensor in pieces, or (distributed) the reduce-scattered chunk, the flat parameters, AdamW in
// pieces on each tensor's part of the chunk, the all-gathered parameters and the all-gathered
// gradient. The gradient norm is one world all-reduce of one element.
void StepReplay::optimizer_update() {
  l_.at("optimizer update");
  const double flat = r_.flat_size(), chunk = r_.chunk();
  std::vector<int> update{l_.alloc(flat, "flat gradient")};
  if (r_.zero_stage == 0) {
    groups_.dp.all_reduce_sum(flat);
    groups_.world.all_reduce_sum(1);
    for (const HeldTensor& t : r_.held) adamw_pieces(t.numel);
  } else {
    update.push_back(l_.alloc(chunk, "gradient chunk"));
    groups_.dp.reduce_scatter_sum(chunk);
    groups_.world.all_reduce_sum(1);
    update.push_back(l_.alloc(flat, "flat parameters"));
    const double begin = chunk * static_cast<double>(r_.dp_cp_rank()), end = begin + chunk;
    double offset = 0;
    for (const HeldTensor& t : r_.held) {
      const double part = std::min(end, offset + t.numel) - std::max(begin, offset);
      if (part > 0) adamw_pieces(part);
      offset += t.numel;
    }
    update.push_back(l_.alloc(flat, "gathered parameters"));
    if (r_.collect_outputs) update.push_back(l_.alloc(flat, "gathered gradient"));
  }
  l_.release(update);
}

// Zero stages 2 and 3: the step's gradients (Trainer::step's record.grads), which the model state of
// those stages leaves out: each full tensor at stage 2 (until reduce-scattered), each shard at stage 3.
std::vector<int> StepReplay::step_gradients() {
  std::vector<int> grads;
  for (const HeldTensor& t : r_.held) {
    if (r_.zero_stage == 2)
      grads.push_back(l_.alloc_outside_arena(t.numel, "gradient (until reduce-scattered)"));
    if (r_.zero_stage == 3) grads.push_back(l_.alloc_outside_arena(r_.shard(t), "gradient shard"));
  }
  return grads;
}

// DataParallelOptimizer::step at stages 2 and 3: stage 2 reduce-scatters each gradient into a shard
// (freeing the full tensor), updates parameter shards and gathers the parameters back (each into a
// buffer of dp shards that replaces the old tensor); stage 3 updates the shards in place. With outputs,
// the gathered gradients replace the shards.
void StepReplay::sharded_update(std::vector<int>& grads) {
  l_.at("optimizer update");
  std::vector<int> shards;
  if (r_.zero_stage == 2) {
    shards.push_back(l_.alloc_outside_arena(r_.shards(), "gradient shards"));
    for (size_t i = 0; i < r_.held.size(); ++i) {
      replay_reduce_scatter_add(l_, groups_.dp, r_, r_.held[i]);
      l_.release(grads[i]);
    }
    grads.clear();
    shards.push_back(l_.alloc_outside_arena(r_.shards(), "parameter shards"));
  }
  groups_.world.all_reduce_sum(1);
  for (const HeldTensor& t : r_.held) adamw_pieces(r_.shard(t));
  if (r_.zero_stage == 2) {
    std::vector<int> gathered;
    for (const HeldTensor& t : r_.held)
      gathered.push_back(l_.alloc_outside_arena(r_.gathered(t), "gathered parameters"));
    l_.release(gathered);  // they become the weights; the old weights go
    l_.release(shards.back());
    shards.pop_back();
  }
  if (r_.collect_outputs) {
    std::vector<int> gathered;
    for (const HeldTensor& t : r_.held)
      gathered.push_back(l_.alloc_outside_arena(r_.gathered(t), "gathered gradient"));
    l_.release(grads);  // stage 3: the shards the gathered gradients replace
    grads = gathered;
  }
  l_.release(shards);
}

// Trainer::step. In FP64 the passes read the weights themselves (only BF16 makes a copy); the
// loss-token count is an integer all-reduce, which goes to MPI without scratch.
void StepReplay::step(Fp64StepReplay* breakdown) {
  // Context parallelism: this rank's rows of every micro-batch (GlobalBatch::context_micro_batch), five
  // int32 lists of its N positions, half a double each.
  const int rows = r_.cp > 1 ? l_.alloc_outside_arena(static_cast<double>(r_.micro_batches) * 5 * d_.N / 2,
                                                      "this rank's rows of the micro-batches (int32)")
                             : -1;
  std::vector<int> grads = step_gradients();
  l_.begin_arena_step();  // Trainer::step's ActivationArena::Step, from the passes to the update
  const std::vector<int> token_records = pipeline(breakdown);
  l_.context("");
  l_.at("loss");
  groups_.world.all_reduce_sum(1);
  const int all = r_.collect_outputs ? gather_token_losses() : -1;
  finalize_grads();
  if (r_.zero_stage >= 2) {
    sharded_update(grads);
  } else {
    optimizer_update();
  }
  l_.end_arena_step(!r_.moments_dropped);  // a run of one step lays out no block
  if (all >= 0) l_.release(all);
  l_.release(token_records);
  l_.release(grads);  // the step's record, dropped by the caller
  if (rows >= 0) l_.release(rows);
}

}  // namespace

Fp64StepReplay replay_fp64_step(const Fp64Rank& rank) { return StepReplay(rank).run(); }

}  // namespace touchstone::plan
