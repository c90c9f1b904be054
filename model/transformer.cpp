// Forward and backward of the decoder, block by block: each block's backward sits next to its forward.
// Shapes: N = b*T rows of the full sequence, Nl = rows of the residual stream on this rank, NHl, NKVl,
// Fl, Vl = this tp rank's heads, KV heads, ffn columns and vocabulary rows.
#include "model/transformer.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace touchstone {

namespace {
ActivationBuffer buffer(int64_t n) { return ActivationBuffer(static_cast<size_t>(n)); }
// Frees the buffer at once (clear() would keep the capacity).
void release(ActivationBuffer& v) { ActivationBuffer().swap(v); }
}  // namespace

LayerDropoutKeys layer_dropout_keys(int64_t seed, int64_t layer) {
  const auto s = static_cast<uint64_t>(seed);
  const std::string suffix = "/layer" + std::to_string(layer);
  return {stream_key(s, "dropout/attention" + suffix), stream_key(s, "dropout/hidden_attn" + suffix),
          stream_key(s, "dropout/hidden_mlp" + suffix)};
}

Transformer::Transformer(const ModelConfig& model, bool document_masking, int64_t dropout_seed,
                         const ParamTable& table, Backend& backend, const TensorParallelRegion& tp,
                         const StageRange& stage)
    : model_(model),
      document_masking_(document_masking),
      table_(table),
      backend_(backend),
      tp_(tp),
      stage_(stage) {
  for (int64_t l = 0; l < model.num_layers; ++l) dropout_keys_.push_back(layer_dropout_keys(dropout_seed, l));
}

AttentionShape Transformer::attention_shape(int64_t windows) const {
  const int64_t t = tp_.tp_size();
  return AttentionShape{windows, model_.seq_length, model_.num_heads / t, model_.num_kv_heads / t,
                        model_.head_dim()};
}

void Transformer::norm_gather(const double* x, const std::vector<double>& weight, int64_t windows,
                              ActivationBuffer& h, ActivationBuffer& rstd) const {
  const int64_t N = windows * model_.seq_length, Nl = tp_.local_rows(N), H = model_.hidden_size;
  rstd = buffer(Nl);
  ActivationBuffer h_local = buffer(Nl * H);
  backend_.rmsnorm_forward(x, weight.data(), Nl, H, model_.norm_eps, h_local.data(), rstd.data());
  if (!tp_.sequence_parallel()) {
    h = std::move(h_local);  // what the identity gather would copy
    return;
  }
  tp_.gather(h_local, N, H, h);
}

// ---- dropout: masks keyed by global coordinates (docs/architecture.md "Dropout") ------------------------

DropoutSite Transformer::dropout_site(const PhiloxKey& key, double probability,
                                      const MicroBatch& batch) const {
  if (batch.sample_indices == nullptr) {
    throw std::invalid_argument(
        "dropout needs the global sample index of every window (MicroBatch::sample_indices)");
  }
  return DropoutSite{key, probability, batch.sample_indices};
}

AttentionDropout Transformer::attention_dropout(int64_t layer, const MicroBatch& batch) const {
  if (model_.attention_dropout == 0.0) return {};  // off
  // This rank's heads are global heads [tp_rank * NHl, (tp_rank + 1) * NHl): whole KV groups in order.
  return AttentionDropout{dropout_site(dropout_keys_[layer].attention, model_.attention_dropout, batch),
                          tp_.tp_rank() * attention_shape(batch.windows).num_heads};
}

void Transformer::hidden_dropout_forward(const PhiloxKey& key, const MicroBatch& batch, ActivationBuffer& out,
                                         ActivationBuffer& keep) const {
  if (model_.hidden_dropout == 0.0) return;  // off: no mask, the output untouched
  const int64_t N = batch.windows * model_.seq_length, Nl = tp_.local_rows(N), H = model_.hidden_size;
  keep = buffer(Nl * H);
  // With sequence parallelism this rank holds rows [first_local_row, + Nl) of the N rows: their mask is
  // drawn at their global rows, so the blocks of all ranks form the single-rank mask.
  backend_.hidden_dropout_mask(dropout_site(key, model_.hidden_dropout, batch), tp_.first_local_row(N), Nl,
                               model_.seq_length, H, keep.data());
  backend_.dropout_forward(out.data(), keep.data(), Nl * H, out.data());
}

const ActivationBuffer& Transformer::hidden_dropout_backward(const ActivationBuffer& dx,
                                                             const ActivationBuffer& keep,
                                                             ActivationBuffer& scratch) const {
  if (keep.empty()) return dx;
  scratch = buffer(static_cast<int64_t>(dx.size()));
  backend_.dropout_backward(dx.data(), keep.data(), static_cast<int64_t>(dx.size()), scratch.data());
  return scratch;
}

// ---- attention block: x += Dropout(RowParallel(attention(RoPE(split(ColumnParallel(RMSNorm(x))))))) ----

void Transformer::attention_block_forward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                                          LayerActivations& a, ActivationBuffer& x) const {
  const LayerParamIds& ids = table_.layer(layer);
  const AttentionShape s = attention_shape(batch.windows);
  const int64_t N = batch.windows * s.seq, Nl = tp_.local_rows(N), H = model_.hidden_size, D = s.head_dim;
  const int64_t qkv_cols = (s.num_heads + 2 * s.num_kv_heads) * D;  // this rank's whole KV groups
  a.x_in = x;
  norm_gather(x.data(), params[ids.input_norm], batch.windows, a.h_attn, a.rstd_attn);
  ActivationBuffer qkv = buffer(N * qkv_cols);
  backend_.linear_forward(a.h_attn.data(), params[ids.qkv].data(), N, H, qkv_cols, qkv.data());
  // Without sequence parallelism the backward recomputes h_attn from x_in (a local RMSNorm). With it, h_attn
  // is kept: recomputing it would repeat the all-gather (as Megatron-LM does), changing the communication.
  if (!tp_.sequence_parallel()) release(a.h_attn);
  a.q = buffer(N * s.num_heads * D);
  a.k = buffer(N * s.num_kv_heads * D);
  a.v = buffer(N * s.num_kv_heads * D);
  backend_.qkv_split(qkv.data(), s, a.q.data(), a.k.data(), a.v.data());
  release(qkv);
  backend_.rope(a.q.data(), batch.position_ids, s.windows, s.num_heads, s.seq, D, model_.rope_theta, false);
  backend_.rope(a.k.data(), batch.position_ids, s.windows, s.num_kv_heads, s.seq, D, model_.rope_theta,
                false);
  a.lse = buffer(s.windows * s.num_heads * s.seq);
  a.attn = buffer(N * s.num_heads * D);
  backend_.attention_forward(a.q.data(), a.k.data(), a.v.data(), batch.document_ids, document_masking_,
                             attention_dropout(layer, batch), s, a.attn.data(), a.lse.data());
  ActivationBuffer proj_partial = buffer(N * H), proj;
  backend_.linear_forward(a.attn.data(), params[ids.proj].data(), N, s.num_heads * D, H, proj_partial.data());
  tp_.reduce(proj_partial, N, H, proj);  // RowParallelLinear exit
  hidden_dropout_forward(dropout_keys_[layer].hidden_attention, batch, proj, a.hidden_attn_keep);
  backend_.add_inplace(x.data(), proj.data(), Nl * H);
}

void Transformer::attention_block_backward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                                           LayerActivations& a, ActivationBuffer& dx, ParamTensors& grads,
                                           DeferredWeightGradients* deferred) const {
  const LayerParamIds& ids = table_.layer(layer);
  const AttentionShape s = attention_shape(batch.windows);
  const int64_t N = batch.windows * s.seq, Nl = tp_.local_rows(N), H = model_.hidden_size, D = s.head_dim;
  const int64_t qkv_cols = (s.num_heads + 2 * s.num_kv_heads) * D;
  // Backward of the hidden dropout, then of the RowParallelLinear exit.
  // Every buffer, stored or not, is freed after its last use.
  ActivationBuffer dproj, scratch;  // [N,H], [Nl,H]
  tp_.gather(hidden_dropout_backward(dx, a.hidden_attn_keep, scratch), N, H, dproj);
  release(scratch);
  release(a.hidden_attn_keep);
  ActivationBuffer dattn = buffer(N * s.num_heads * D);
  linear_backward(dproj, a.attn, params[ids.proj].data(), N, s.num_heads * D, H, dattn.data(),
                  grads[ids.proj].data(), deferred);
  release(dproj);
  ActivationBuffer dq = buffer(N * s.num_heads * D), dk = buffer(N * s.num_kv_heads * D),
                   dv = buffer(N * s.num_kv_heads * D);
  backend_.attention_backward(dattn.data(), a.q.data(), a.k.data(), a.v.data(), a.attn.data(), a.lse.data(),
                              batch.document_ids, document_masking_, attention_dropout(layer, batch), s,
                              dq.data(), dk.data(), dv.data());
  for (ActivationBuffer* t : {&dattn, &a.q, &a.k, &a.v, &a.attn, &a.lse}) release(*t);
  backend_.rope(dq.data(), batch.position_ids, s.windows, s.num_heads, s.seq, D, model_.rope_theta, true);
  backend_.rope(dk.data(), batch.position_ids, s.windows, s.num_kv_heads, s.seq, D, model_.rope_theta, true);
  ActivationBuffer dqkv = buffer(N * qkv_cols);
  backend_.qkv_merge(dq.data(), dk.data(), dv.data(), s, dqkv.data());
  for (ActivationBuffer* t : {&dq, &dk, &dv}) release(*t);
  // h_attn [N,H] again: the forward's RMSNorm call on x_in, its rstd [Nl] equal to rstd_attn.
  if (!tp_.sequence_parallel()) {
    ActivationBuffer rstd;
    norm_gather(a.x_in.data(), params[ids.input_norm], batch.windows, a.h_attn, rstd);
  }
  ActivationBuffer dh_partial = buffer(N * H), dh;  // [N,H], [Nl,H]
  linear_backward(dqkv, a.h_attn, params[ids.qkv].data(), N, H, qkv_cols, dh_partial.data(),
                  grads[ids.qkv].data(), deferred);
  release(dqkv);
  release(a.h_attn);
  tp_.reduce(dh_partial, N, H, dh);  // backward of the ColumnParallelLinear entry
  release(dh_partial);               // kept by the reduce-scatter; moved from by the all-reduce
  ActivationBuffer dnorm_in = buffer(Nl * H);
  backend_.rmsnorm_backward(dh.data(), a.x_in.data(), params[ids.input_norm].data(), a.rstd_attn.data(), Nl,
                            H, dnorm_in.data(), grads[ids.input_norm].data());
  for (ActivationBuffer* t : {&dh, &a.x_in, &a.rstd_attn}) release(*t);
  backend_.add_inplace(dx.data(), dnorm_in.data(), Nl * H);  // the residual branch joins the skip path
}

// ---- MLP block: x += Dropout(RowParallel(silu(gate) * up)), [gate | up] = ColumnParallel(RMSNorm(x)) ---

void Transformer::mlp_block_forward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                                    LayerActivations& a, ActivationBuffer& x) const {
  const LayerParamIds& ids = table_.layer(layer);
  const int64_t N = batch.windows * model_.seq_length, Nl = tp_.local_rows(N), H = model_.hidden_size;
  const int64_t F = model_.ffn_hidden_size / tp_.tp_size();
  a.x_mid = x;
  norm_gather(x.data(), params[ids.pre_mlp_norm], batch.windows, a.h_mlp, a.rstd_mlp);
  a.fc1 = buffer(N * 2 * F);
  backend_.linear_forward(a.h_mlp.data(), params[ids.fc1].data(), N, H, 2 * F, a.fc1.data());
  if (!tp_.sequence_parallel()) release(a.h_mlp);  // recomputed in the backward, as h_attn
  ActivationBuffer act = buffer(N * F);  // [N,Fl] silu(gate) * up, recomputed from fc1 in the backward
  backend_.swiglu_forward(a.fc1.data(), N, F, act.data());
  ActivationBuffer out_partial = buffer(N * H), out;
  backend_.linear_forward(act.data(), params[ids.fc2].data(), N, F, H, out_partial.data());
  release(act);
  tp_.reduce(out_partial, N, H, out);
  hidden_dropout_forward(dropout_keys_[layer].hidden_mlp, batch, out, a.hidden_mlp_keep);
  backend_.add_inplace(x.data(), out.data(), Nl * H);
}

void Transformer::mlp_block_backward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                                     LayerActivations& a, ActivationBuffer& dx, ParamTensors& grads,
                                     DeferredWeightGradients* deferred) const {
  const LayerParamIds& ids = table_.layer(layer);
  const int64_t N = batch.windows * model_.seq_length, Nl = tp_.local_rows(N), H = model_.hidden_size;
  const int64_t F = model_.ffn_hidden_size / tp_.tp_size();
  ActivationBuffer dout, scratch;  // [N,H], [Nl,H]
  tp_.gather(hidden_dropout_backward(dx, a.hidden_mlp_keep, scratch), N, H, dout);
  release(scratch);
  release(a.hidden_mlp_keep);
  ActivationBuffer act = buffer(N * F);  // [N,Fl] the forward's SwiGLU call on the stored fc1 again
  backend_.swiglu_forward(a.fc1.data(), N, F, act.data());
  ActivationBuffer dact = buffer(N * F);
  linear_backward(dout, act, params[ids.fc2].data(), N, F, H, dact.data(), grads[ids.fc2].data(), deferred);
  release(dout);
  release(act);
  ActivationBuffer dfc1 = buffer(N * 2 * F);
  backend_.swiglu_backward(dact.data(), a.fc1.data(), N, F, dfc1.data());
  release(dact);
  release(a.fc1);
  if (!tp_.sequence_parallel()) {  // h_mlp [N,H] again, as h_attn in the attention block
    ActivationBuffer rstd;
    norm_gather(a.x_mid.data(), params[ids.pre_mlp_norm], batch.windows, a.h_mlp, rstd);
  }
  ActivationBuffer dh_partial = buffer(N * H), dh;  // [N,H], [Nl,H]
  linear_backward(dfc1, a.h_mlp, params[ids.fc1].data(), N, H, 2 * F, dh_partial.data(),
                  grads[ids.fc1].data(), deferred);
  release(dfc1);
  release(a.h_mlp);
  tp_.reduce(dh_partial, N, H, dh);
  release(dh_partial);
  ActivationBuffer dnorm_in = buffer(Nl * H);
  backend_.rmsnorm_backward(dh.data(), a.x_mid.data(), params[ids.pre_mlp_norm].data(), a.rstd_mlp.data(), Nl,
                            H, dnorm_in.data(), grads[ids.pre_mlp_norm].data());
  for (ActivationBuffer* t : {&dh, &a.x_mid, &a.rstd_mlp}) release(*t);
  backend_.add_inplace(dx.data(), dnorm_in.data(), Nl * H);
}

// ---- head (last stage): final norm -> vocab-parallel output layer -> vocab-parallel cross entropy --------

void Transformer::head_forward(const ParamTensors& params, const MicroBatch& batch, Activations& acts) const {
  const int64_t N = batch.windows * model_.seq_length, H = model_.hidden_size;
  const int64_t V = vocab_local();
  ProcessGroup& tp = tp_.group();
  norm_gather(acts.x_final.data(), params[table_.final_norm()], batch.windows, acts.h_final, acts.rstd_final);
  acts.logits = buffer(N * V);  // this rank's vocabulary slice: the full logits are never assembled
  backend_.linear_forward(acts.h_final.data(), params[table_.output()].data(), N, H, V, acts.logits.data());
  acts.row_max = buffer(N);
  acts.sum_exp = buffer(N);
  ActivationBuffer target_logit = buffer(N);
  backend_.logits_row_max(acts.logits.data(), N, V, acts.row_max.data());
  tp.all_reduce_max(acts.row_max.data(), N, {N});
  backend_.cross_entropy_partials(acts.logits.data(), batch.targets, N, V, vocab_start(), acts.row_max.data(),
                                  acts.sum_exp.data(), target_logit.data());
  tp.all_reduce_sum(target_logit.data(), N, {N});
  tp.all_reduce_sum(acts.sum_exp.data(), N, {N});
  acts.token_losses = buffer(N);
  backend_.cross_entropy_loss(acts.row_max.data(), acts.sum_exp.data(), target_logit.data(), batch.targets, N,
                              acts.token_losses.data());
}

void Transformer::head_backward(const ParamTensors& params, const MicroBatch& batch, Activations& acts,
                                double loss_weight, ParamTensors& grads, ActivationBuffer& dx,
                                DeferredWeightGradients* deferred) const {
  const int64_t N = batch.windows * model_.seq_length, Nl = tp_.local_rows(N), H = model_.hidden_size;
  const int64_t V = vocab_local();
  // dlogits take the logits' place, so that two [N,Vl] buffers (the largest at long T) are never alive
  // at once: block by block of rows, the cross entropy backward writes into `block` [R,Vl], copied over
  // the rows it has just read. The kernel computes each row from that row alone, so the bits are those
  // of one call over all N rows.
  {
    const int64_t block_rows = std::min(N, kCrossEntropyRows);
    ActivationBuffer block = buffer(block_rows * V);
    for (int64_t first = 0; first < N; first += block_rows) {
      const int64_t rows = std::min(block_rows, N - first);
      double* logits = acts.logits.data() + first * V;
      backend_.cross_entropy_backward(logits, batch.targets + first, rows, V, vocab_start(),
                                      acts.row_max.data() + first, acts.sum_exp.data() + first, loss_weight,
                                      block.data());
      std::copy_n(block.data(), rows * V, logits);
    }
  }
  ActivationBuffer dlogits = std::move(acts.logits);  // [N,Vl]
  release(acts.row_max);
  release(acts.sum_exp);
  ActivationBuffer dh_partial = buffer(N * H), dh;  // [N,H], [Nl,H]
  // With tied embeddings output() is the embedding, so both uses add into one gradient.
  linear_backward(dlogits, acts.h_final, params[table_.output()].data(), N, H, V, dh_partial.data(),
                  grads[table_.output()].data(), deferred);
  release(dlogits);
  release(acts.h_final);
  tp_.reduce(dh_partial, N, H, dh);
  release(dh_partial);
  dx = buffer(Nl * H);
  backend_.rmsnorm_backward(dh.data(), acts.x_final.data(), params[table_.final_norm()].data(),
                            acts.rstd_final.data(), Nl, H, dx.data(), grads[table_.final_norm()].data());
  release(acts.x_final);
  release(acts.rstd_final);
}

// ---- one stage: [embedding] -> layers -> [head] ----------------------------------------------------------

void Transformer::before(Pass pass, const ParameterUnit& unit, DeferredWeightGradients* deferred) const {
  if (deferred != nullptr) deferred->units.push_back(unit);
  if (hooks_ == nullptr) return;
  if (pass == kForward) hooks_->before_forward(unit);
  if (pass == kBackward) hooks_->before_backward(unit);
}

void Transformer::after(Pass pass, const ParameterUnit& unit, const DeferredWeightGradients* deferred) const {
  if (hooks_ == nullptr) return;
  if (pass == kForward) hooks_->after_forward(unit);
  if (pass == kBackward) hooks_->after_backward(unit, deferred != nullptr);
}

void Transformer::forward(const ParamTensors& params, const MicroBatch& batch, const ActivationBuffer* input,
                          Activations& acts) const {
  const int64_t N = batch.windows * model_.seq_length, H = model_.hidden_size;
  ActivationBuffer x;  // [Nl,H] the residual stream
  if (stage_.first_stage) {
    before(kForward, {ParameterUnit::Kind::kEmbedding});
    ActivationBuffer partial = buffer(N * H);  // VocabParallelEmbedding: rows outside the slice are 0
    backend_.embedding_forward(batch.tokens, params[table_.embedding()].data(), N, H, vocab_start(),
                               vocab_local(), partial.data());
    after(kForward, {ParameterUnit::Kind::kEmbedding});
    tp_.reduce(partial, N, H, x);
  } else {
    x = *input;
  }
  acts.layers.resize(static_cast<size_t>(stage_.end_layer - stage_.first_layer));
  for (int64_t l = stage_.first_layer; l < stage_.end_layer; ++l) {
    LayerActivations& a = acts.layers[static_cast<size_t>(l - stage_.first_layer)];
    before(kForward, {ParameterUnit::Kind::kLayer, l});
    attention_block_forward(params, l, batch, a, x);
    mlp_block_forward(params, l, batch, a, x);
    after(kForward, {ParameterUnit::Kind::kLayer, l});
  }
  acts.x_final = std::move(x);
  if (stage_.last_stage) {
    before(kForward, {ParameterUnit::Kind::kHead});
    head_forward(params, batch, acts);
    after(kForward, {ParameterUnit::Kind::kHead});
  }
}

void Transformer::backward(const ParamTensors& params, const MicroBatch& batch, Activations& acts,
                           double loss_weight, const ActivationBuffer* d_output, ParamTensors& grads,
                           ActivationBuffer* d_input, DeferredWeightGradients* deferred) const {
  const int64_t N = batch.windows * model_.seq_length, H = model_.hidden_size;
  ActivationBuffer dx;  // [Nl,H]
  if (stage_.last_stage) {
    before(kBackward, {ParameterUnit::Kind::kHead}, deferred);
    head_backward(params, batch, acts, loss_weight, grads, dx, deferred);
    after(kBackward, {ParameterUnit::Kind::kHead}, deferred);
  } else {
    release(acts.x_final);  // the stage's output: its send made a copy
    dx = *d_output;
  }
  for (int64_t l = stage_.end_layer - 1; l >= stage_.first_layer; --l) {
    LayerActivations& a = acts.layers[static_cast<size_t>(l - stage_.first_layer)];
    before(kBackward, {ParameterUnit::Kind::kLayer, l}, deferred);
    mlp_block_backward(params, l, batch, a, dx, grads, deferred);
    attention_block_backward(params, l, batch, a, dx, grads, deferred);
    after(kBackward, {ParameterUnit::Kind::kLayer, l}, deferred);
  }
  if (stage_.first_stage) {
    ActivationBuffer dfull;
    tp_.gather(dx, N, H, dfull);
    before(kBackward, {ParameterUnit::Kind::kEmbedding}, deferred);
    if (deferred != nullptr) {
      deferred->embedding.push_back(
          {std::move(dfull), batch.tokens, N, grads[table_.embedding()].data(), deferred->units.size() - 1});
    } else {
      backend_.embedding_backward(batch.tokens, dfull.data(), N, H, vocab_start(), vocab_local(),
                                  grads[table_.embedding()].data());
    }
    after(kBackward, {ParameterUnit::Kind::kEmbedding}, deferred);
  } else {
    *d_input = std::move(dx);
  }
}

}  // namespace touchstone
