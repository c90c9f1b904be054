// Allocation replay of one micro-batch's forward and backward (model/transformer.cpp).
//
// Each function below mirrors one function of the model and allocates, in the same order, the buffers
// it allocates (std::vector<double>: 8 bytes per element) and frees them where it frees them: buffers
// local to a function when it returns or after their last use, stored activations one by one in the
// backward (what is left when the executor drops the micro-batch's Activations).
#include "plan/fp64_pass_replay.h"

#include <algorithm>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "plan/context_attention_replay.h"

namespace touchstone::plan {

Dims dims_of(const Fp64Rank& r) {
  const auto t = static_cast<double>(r.tp);
  const ModelShape& m = r.shape;
  const int64_t seq = m.seq / r.cp;  // this rank's positions of each window
  const double N = static_cast<double>(r.micro_batch * seq);
  const AttentionShape attention{r.micro_batch, seq, m.heads / r.tp, m.kv_heads / r.tp, m.head_dim()};
  return Dims{N,
              r.sequence_parallel ? N / t : N,
              static_cast<double>(m.hidden),
              static_cast<double>(m.head_dim()),
              static_cast<double>(m.heads) / t,
              static_cast<double>(m.kv_heads) / t,
              static_cast<double>(m.ffn) / t,
              static_cast<double>(m.vocab) / t,
              static_cast<double>(r.micro_batch),
              static_cast<double>(seq),
              static_cast<double>(r.cp),
              r.sequence_parallel,
              static_cast<double>(CpuBackend::attention_forward_scratch(attention)),
              static_cast<double>(CpuBackend::attention_backward_scratch(attention))};
}

// A stored activation: kept in `stored`, and named in `names` for the breakdown when asked.
struct PassReplay::Keeper {
  BufferTally& l;
  PassStored& stored;
  std::vector<NamedBytes>* names;
  int keep(double elements, const std::string& what) {
    return add(l.alloc(elements, what, BufferKind::kStored), what);
  }
  int add(int h, const std::string& what) {
    stored.all.push_back(h);
    if (names) names->push_back({what, l.bytes(h)});
    return h;
  }
};

// Transformer::row_parallel_output_grad after the dropout's scratch: with sequence parallelism the
// all-gather receives the full rows [N,H], with no scratch; without it the local rows are used as they
// are (-1: no buffer), unless the split backward keeps them, in a copy.
int PassReplay::row_parallel_output_grad(const std::string& what) {
  if (!d_.sp && deferred_ == nullptr) return -1;
  return l_.alloc(d_.N * d_.H, what);
}

// TensorParallelRegion::reduce: the all-reduce sums the partial sums in place, through the group's
// scratch, and they move into the result (plain TP); or a new buffer of the local rows receives the
// reduce-scatter while the partial sums stay alive (SP).
int PassReplay::reduce(int partial, const std::string& what) {
  if (!d_.sp) {
    tp_.all_reduce_sum(d_.N * d_.H);
    return partial;
  }
  const int local = l_.alloc(d_.Nl * d_.H, what);
  tp_.reduce_scatter_sum(d_.Nl * d_.H);
  return local;
}

// Transformer::norm_gather after its rstd [Nl] (allocated by the caller): the local norm output [Nl,H]
// is h itself without sequence parallelism; with it the all-gather receives h [N,H] and the local rows
// are freed on return. Returns h's handle, of `kind`.
int PassReplay::norm_gather(const std::string& what, BufferKind kind) {
  if (!d_.sp) return l_.alloc(d_.Nl * d_.H, what, kind);
  const int local = l_.alloc(d_.Nl * d_.H, "h_local");
  const int h = l_.alloc(d_.N * d_.H, what, kind);
  l_.release(local);
  return h;
}

// The backward's RMSNorm output again (no sequence parallelism): a scratch rstd [Nl] for the scope of
// the call, and h [N,H].
int PassReplay::recompute_norm(const std::string& what) {
  const int rstd = l_.alloc(d_.Nl, "rstd (recomputed)");
  const int h = norm_gather(what + " (recomputed)", BufferKind::kWorking);
  l_.release(rstd);
  return h;
}

// Transformer::keep_and_advance at a block's end: the stream x is kept as the block's input, and the
// branch's buffer, holding the sum, becomes the stream.
int PassReplay::keep_and_advance(Keeper k, int& x, int branch, const std::string& what) {
  l_.store(x);
  const int kept = k.add(x, what);
  x = branch;
  return kept;
}

LayerStored PassReplay::attention_forward(Keeper k, int& x) {
  LayerStored s;
  s.rstd_attn = k.keep(d_.Nl, "rstd_attn");
  // h_attn is stored with sequence parallelism only; without, the backward recomputes it.
  const int h = norm_gather("h_attn", d_.sp ? BufferKind::kStored : BufferKind::kWorking);
  if (d_.sp) s.h_attn = k.add(h, "h_attn");
  const int qkv = l_.alloc(d_.N * (d_.heads + 2 * d_.kv_heads) * d_.D, "qkv");
  if (!d_.sp) l_.release(h);
  s.q = k.keep(d_.N * d_.heads * d_.D, "q");
  s.k = k.keep(d_.N * d_.kv_heads * d_.D, "k");
  s.v = k.keep(d_.N * d_.kv_heads * d_.D, "v");
  l_.release(qkv);
  s.lse = k.keep(d_.windows * d_.heads * d_.T, "lse");
  s.attn = k.keep(d_.N * d_.heads * d_.D, "attn");
  if (r_.cp > 1) {
    replay_context_attention_forward(l_, d_, r_.cp_comm, threads_, {cp_, cp_sends_});
  } else {
    l_.release(l_.alloc_outside_arena(threads_ * d_.attention_forward_scratch,
                                      "attention tiles (per kernel thread)"));
  }
  const int proj_partial = l_.alloc(d_.N * d_.H, "proj_partial");
  const int proj = reduce(proj_partial, "proj");
  if (r_.hidden_dropout) s.attn_keep = k.keep(d_.Nl * d_.H, "hidden_attn_keep (dropout mask)");
  s.x_in = keep_and_advance(k, x, proj, "x_in");
  if (proj != proj_partial) l_.release(proj_partial);
  return s;
}

void PassReplay::mlp_forward(Keeper k, LayerStored& s, int& x) {
  s.rstd_mlp = k.keep(d_.Nl, "rstd_mlp");
  const int h = norm_gather("h_mlp", d_.sp ? BufferKind::kStored : BufferKind::kWorking);
  if (d_.sp) s.h_mlp = k.add(h, "h_mlp");
  s.fc1 = k.keep(d_.N * 2 * d_.ffn, "fc1");
  if (!d_.sp) l_.release(h);
  const int act = l_.alloc(d_.N * d_.ffn, "act");  // given again by SwiGLU's backward
  const int out_partial = l_.alloc(d_.N * d_.H, "out_partial");
  l_.release(act);
  const int out = reduce(out_partial, "out");
  if (r_.hidden_dropout) s.mlp_keep = k.keep(d_.Nl * d_.H, "hidden_mlp_keep (dropout mask)");
  s.x_mid = keep_and_advance(k, x, out, "x_mid");
  if (out != out_partial) l_.release(out_partial);
}

void PassReplay::head_forward(Keeper k, PassStored& s) {
  s.rstd_final = k.keep(d_.Nl, "rstd_final");
  s.h_final = k.add(norm_gather("h_final", BufferKind::kStored), "h_final");
  s.logits = k.keep(d_.N * d_.vocab, "logits");
  s.row_max = k.keep(d_.N, "row_max");
  s.sum_exp = k.keep(d_.N, "sum_exp");
  const int target_logit = l_.alloc(d_.N, "target_logit");
  // The row maxima go through MPI_Allreduce directly; the two sums through the scratch.
  tp_.all_reduce_sum(d_.N);
  tp_.all_reduce_sum(d_.N);
  k.keep(d_.N, "token_losses");
  l_.release(target_logit);
}

void replay_reduce_scatter_add(BufferTally& tally, GroupScratch& dp, const Fp64Rank& rank,
                               const HeldTensor& t) {
  const std::vector<int> buffers{tally.alloc_outside_arena(rank.gathered(t), "gradient padded to dp shards"),
                                 tally.alloc_outside_arena(rank.shard(t), "reduce-scattered chunk")};
  dp.reduce_scatter_sum(rank.shard(t));
  tally.release(buffers);
}

PassReplay::UnitBuffers PassReplay::unit_before(Unit unit, int64_t layer, bool backward) {
  UnitBuffers u;
  if (r_.zero_stage != 3) return u;
  u.backward = backward;
  for (const HeldTensor& t : r_.held) {
    const bool in_unit = unit == Unit::kEmbedding ? t.embedding
                         : unit == Unit::kHead    ? t.head
                                                  : t.layer == chunk_->first_layer + layer;
    if (in_unit) u.tensors.push_back(&t);
  }
  for (const HeldTensor* t : u.tensors)
    u.params.push_back(l_.alloc_outside_arena(r_.gathered(*t), "gathered parameter"));
  for (const HeldTensor* t : u.tensors) {
    UnitGradient& g = unit_grads_[t];
    if (backward && g.handle < 0) g.handle = l_.alloc_outside_arena(t->numel, "unit gradient");
  }
  return u;
}

void PassReplay::reduce_scatter_unit_gradient(const HeldTensor* t) {
  replay_reduce_scatter_add(l_, dp_, r_, *t);
  l_.release(unit_grads_[t].handle);
  unit_grads_.erase(t);
}

void PassReplay::unit_after(UnitBuffers& u) {
  if (u.backward) {
    for (const HeldTensor* t : u.tensors) {
      UnitGradient& g = unit_grads_[t];
      if (deferred_ != nullptr) {
        ++g.pending_weights;
      } else if (g.pending_weights == 0) {
        reduce_scatter_unit_gradient(t);
      }
    }
    if (deferred_ != nullptr) deferred_->units.push_back(u.tensors);
  }
  l_.release(u.params);
  u = {};
}

void PassReplay::backward_weights(DeferredReplay& deferred) {
  for (const std::vector<const HeldTensor*>& unit : deferred.units) {
    for (const HeldTensor* t : unit) {
      if (--unit_grads_[t].pending_weights == 0) reduce_scatter_unit_gradient(t);
    }
  }
  l_.release(deferred.buffers);
  deferred = {};
}

PassStored PassReplay::forward(const Fp64Chunk& chunk, Fp64StepReplay* breakdown) {
  chunk_ = &chunk;
  const bool first_stage = chunk.first, last_stage = chunk.last;
  PassStored stored;
  int x = 0;
  if (first_stage) {
    UnitBuffers embedding = unit_before(Unit::kEmbedding, -1, false);
    const int partial = l_.alloc(d_.N * d_.H, "embedding partial");
    unit_after(embedding);
    x = reduce(partial, "x");
    if (x != partial) l_.release(partial);
  } else {
    x = l_.alloc(d_.Nl * d_.H, "x (copy of the received input)");
  }
  for (int64_t layer = 0; layer < chunk.layers; ++layer) {
    l_.at("forward, layer " + std::to_string(chunk.first_layer + layer));
    std::vector<NamedBytes>* names = breakdown && layer == 0 ? &breakdown->stored_per_layer : nullptr;
    UnitBuffers unit = unit_before(Unit::kLayer, layer, false);
    stored.layers.push_back(attention_forward(Keeper{l_, stored, names}, x));
    mlp_forward(Keeper{l_, stored, names}, stored.layers.back(), x);
    unit_after(unit);
  }
  l_.store(x);  // the residual stream becomes x_final
  stored.all.push_back(x);
  stored.x_final = x;
  if (breakdown) breakdown->stored_head.push_back({"x_final", l_.bytes(x)});
  if (last_stage) {
    l_.at("forward, head");
    UnitBuffers head = unit_before(Unit::kHead, -1, false);
    head_forward(Keeper{l_, stored, breakdown ? &breakdown->stored_head : nullptr}, stored);
    unit_after(head);
  }
  return stored;
}

// The hidden dropout's backward writes the masked gradient into a scratch buffer of the local rows,
// freed after the RowParallelLinear backward has read it (or its gathered copy).
std::vector<int> PassReplay::hidden_dropout_scratch() {
  if (!r_.hidden_dropout) return {};
  return {l_.alloc(d_.Nl * d_.H, "hidden dropout backward scratch")};
}

// The backward frees each buffer, stored or working, after its last use (model/transformer.cpp).
void PassReplay::attention_backward(LayerStored& s) {
  const std::vector<int> scratch = hidden_dropout_scratch();
  const int dproj = row_parallel_output_grad("dproj");
  free(s.attn_keep);
  const int dattn = l_.alloc(d_.N * d_.heads * d_.D, "dattn");
  if (dproj >= 0 && !keep_for_weights(dproj, d_.N * d_.heads * d_.D, "attn")) l_.release(dproj);
  l_.release(scratch);
  const int dq = l_.alloc(d_.N * d_.heads * d_.D, "dq"), dk = l_.alloc(d_.N * d_.kv_heads * d_.D, "dk"),
            dv = l_.alloc(d_.N * d_.kv_heads * d_.D, "dv");
  if (r_.cp > 1) {
    replay_context_attention_backward(l_, d_, r_.cp_comm, threads_, {cp_, cp_sends_});
  } else {
    l_.release(l_.alloc_outside_arena(threads_ * d_.attention_backward_scratch,
                                      "attention tiles (per kernel thread)"));
  }
  l_.release({dattn, s.q, s.k, s.v, s.attn, s.lse});
  const int dqkv = l_.alloc(d_.N * (d_.heads + 2 * d_.kv_heads) * d_.D, "dqkv");
  l_.release({dq, dk, dv});
  const int h = d_.sp ? s.h_attn : recompute_norm("h_attn");
  const int dh_partial = l_.alloc(d_.N * d_.H, "dh_partial");
  if (!keep_for_weights(dqkv, d_.N * d_.H, "h_attn")) l_.release(dqkv);
  l_.release(h);
  const int dh = reduce(dh_partial, "dh");
  if (dh != dh_partial) l_.release(dh_partial);
  const int dnorm_in = l_.alloc(d_.Nl * d_.H, "dnorm_in");
  l_.release({dh, s.x_in, s.rstd_attn, dnorm_in});
}

void PassReplay::mlp_backward(LayerStored& s) {
  const std::vector<int> scratch = hidden_dropout_scratch();
  const int dout = row_parallel_output_grad("dout");
  free(s.mlp_keep);
  const int act = l_.alloc(d_.N * d_.ffn, "dact, then act (from SwiGLU's backward)");
  const int dfc1 = l_.alloc(d_.N * 2 * d_.ffn, "dfc1");
  l_.release(s.fc1);
  if (deferred_ != nullptr) {  // Transformer::linear_weight_gradient: W keeps dout and act themselves
    deferred_->buffers.push_back(dout);
    deferred_->buffers.push_back(act);
  } else {
    free(dout);
  }
  l_.release(scratch);
  if (deferred_ == nullptr) l_.release(act);
  const int h = d_.sp ? s.h_mlp : recompute_norm("h_mlp");
  const int dh_partial = l_.alloc(d_.N * d_.H, "dh_partial");
  if (!keep_for_weights(dfc1, d_.N * d_.H, "h_mlp")) l_.release(dfc1);
  l_.release(h);
  const int dh = reduce(dh_partial, "dh");
  if (dh != dh_partial) l_.release(dh_partial);
  const int dnorm_in = l_.alloc(d_.Nl * d_.H, "dnorm_in");
  l_.release({dh, s.x_mid, s.rstd_mlp, dnorm_in});
}

// The cross entropy backward overwrites the logits with dlogits, so no second [N, V] buffer.
int PassReplay::head_backward(PassStored& s) {
  l_.release({s.row_max, s.sum_exp});
  const int dh_partial = l_.alloc(d_.N * d_.H, "dh_partial");
  // dlogits, in the logits' buffer; kept for W, it is no longer the executor's to drop.
  if (keep_for_weights(s.logits, d_.N * d_.H, "h_final")) {
    std::erase(s.all, s.logits);
  } else {
    l_.release(s.logits);
  }
  l_.release(s.h_final);
  const int dh = reduce(dh_partial, "dh");
  if (dh != dh_partial) l_.release(dh_partial);
  const int dx = l_.alloc(d_.Nl * d_.H, "dx");
  l_.release({s.x_final, s.rstd_final, dh});
  return dx;
}

bool PassReplay::keep_for_weights(int dy, double x_elements, const std::string& x_name) {
  if (deferred_ == nullptr) return false;
  deferred_->buffers.push_back(dy);
  deferred_->buffers.push_back(l_.alloc(x_elements, x_name + " (copy kept for the weight gradients)"));
  return true;
}

int PassReplay::backward(const Fp64Chunk& chunk, PassStored& stored, DeferredReplay* deferred) {
  chunk_ = &chunk;
  deferred_ = deferred;
  const bool first_stage = chunk.first, last_stage = chunk.last;
  int dx = 0;
  if (last_stage) {
    l_.at("backward, head");
    UnitBuffers head = unit_before(Unit::kHead, -1, true);
    dx = head_backward(stored);
    unit_after(head);
  } else {
    l_.release(stored.x_final);  // sent (the send made its copy)
    dx = l_.alloc(d_.Nl * d_.H, "dx (copy of the received gradient)");
  }
  for (int64_t layer = chunk.layers - 1; layer >= 0; --layer) {
    l_.at("backward, layer " + std::to_string(chunk.first_layer + layer));
    LayerStored& s = stored.layers[static_cast<size_t>(layer)];
    UnitBuffers unit = unit_before(Unit::kLayer, layer, true);
    mlp_backward(s);
    attention_backward(s);
    unit_after(unit);
  }
  if (first_stage) {
    l_.at("backward, embedding");
    // With sequence parallelism the all-gather's full rows; without, dx itself moves into dfull.
    const int dfull = d_.sp ? l_.alloc(d_.N * d_.H, "dfull") : dx;
    UnitBuffers embedding = unit_before(Unit::kEmbedding, -1, true);
    if (deferred != nullptr) {
      deferred->buffers.push_back(dfull);
      unit_after(embedding);
    } else {
      unit_after(embedding);
      l_.release(dfull);
    }
    if (dfull != dx) l_.release(dx);
    dx = -1;
  }
  deferred_ = nullptr;
  return dx;
}

}  // namespace touchstone::plan
