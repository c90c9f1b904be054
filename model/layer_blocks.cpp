// The two blocks of a decoder layer, attention and MLP, each backward next to its forward (the rest of
// the decoder is in transformer.cpp). Shapes: N = b*T rows of the full sequence (b*T/cp with context
// parallelism: this rank's chunks), Nl = rows of the residual stream on this rank, NHl, NKVl, Fl = this
// tp rank's heads, KV heads and ffn columns. Every transfer names its site in Megatron-LM's words
// (Transformer::tp_site).
#include <string>

#include "model/transformer.h"
#include "model/transformer_helpers.h"

namespace touchstone {

using model::buffer;
using model::layer_module;
using model::release;

// ---- attention block: x += Dropout(RowParallel(attention(RoPE(split(ColumnParallel(RMSNorm(x))))))) ----

void Transformer::attention_block_forward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                                          LayerActivations& a, ActivationBuffer& x) const {
  const LayerParamIds& ids = table_.layer(layer);
  const AttentionShape s = attention_shape(batch.windows);
  const int64_t N = batch.windows * s.seq, H = model_.hidden_size, D = s.head_dim;
  const int64_t qkv_cols = (s.num_heads + 2 * s.num_kv_heads) * D;  // this rank's whole KV groups
  const std::string qkv_module = layer_module(layer, "self_attention.linear_qkv");
  const std::string proj_module = layer_module(layer, "self_attention.linear_proj");
  {
    const TransferSite site =
        tp_site(qkv_module, "ColumnParallelLinear: all-gather of the sequence-parallel input");
    norm_gather(x.data(), params[ids.input_norm], batch.windows, a.h_attn, a.rstd_attn);
  }
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
  if (cp_ != nullptr) {  // this rank's queries against every cp rank's keys (ring or all-gather)
    const TransferSite site(cp_->group(), layer_module(layer, "self_attention.core_attention"));
    cp_->forward(a.q.data(), a.k.data(), a.v.data(), batch.window_document_ids, document_masking_,
                 attention_dropout(layer, batch), s, a.attn.data(), a.lse.data());
  } else {
    backend_.attention_forward(a.q.data(), a.k.data(), a.v.data(), batch.document_ids, document_masking_,
                               attention_dropout(layer, batch), s, a.attn.data(), a.lse.data());
  }
  ActivationBuffer proj_partial = buffer(N * H), proj;
  backend_.linear_forward(a.attn.data(), params[ids.proj].data(), N, s.num_heads * D, H, proj_partial.data());
  {
    const TransferSite site = tp_site(proj_module, "RowParallelLinear: " + tp_reduce_words());
    tp_.reduce(proj_partial, N, H, proj);  // RowParallelLinear exit
  }
  hidden_dropout_forward(dropout_keys_[layer].hidden_attention, batch, proj, a.hidden_attn_keep);
  keep_and_advance(x, proj, a.x_in);
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
  ActivationBuffer scratch, gathered;  // [Nl,H], [N,H]
  ActivationBuffer* dproj = nullptr;   // [N,H] one of dx, scratch, gathered (row_parallel_output_grad)
  {
    const TransferSite site =
        tp_site(layer_module(layer, "self_attention.linear_proj"),
                "RowParallelLinear backward: all-gather of the sequence-parallel output gradient");
    dproj = &row_parallel_output_grad(dx, N, a.hidden_attn_keep, scratch, gathered, deferred);
  }
  release(a.hidden_attn_keep);
  ActivationBuffer dattn = buffer(N * s.num_heads * D);
  linear_backward(*dproj, a.attn, params[ids.proj].data(), N, s.num_heads * D, H, dattn.data(),
                  grads[ids.proj].data(), deferred);
  release(gathered);
  release(scratch);
  ActivationBuffer dq = buffer(N * s.num_heads * D), dk = buffer(N * s.num_kv_heads * D),
                   dv = buffer(N * s.num_kv_heads * D);
  if (cp_ != nullptr) {
    const TransferSite site(cp_->group(), layer_module(layer, "self_attention.core_attention") + " backward");
    cp_->backward(dattn.data(), a.q.data(), a.k.data(), a.v.data(), a.attn.data(), a.lse.data(),
                  batch.window_document_ids, document_masking_, attention_dropout(layer, batch), s, dq.data(),
                  dk.data(), dv.data());
  } else {
    backend_.attention_backward(dattn.data(), a.q.data(), a.k.data(), a.v.data(), a.attn.data(), a.lse.data(),
                                batch.document_ids, document_masking_, attention_dropout(layer, batch), s,
                                dq.data(), dk.data(), dv.data());
  }
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
  {
    const TransferSite site =
        tp_site(layer_module(layer, "self_attention.linear_qkv"),
                "ColumnParallelLinear backward: " + tp_reduce_words() + " of the input gradient");
    tp_.reduce(dh_partial, N, H, dh);  // backward of the ColumnParallelLinear entry
  }
  release(dh_partial);  // kept by the reduce-scatter; moved from by the all-reduce
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
  const int64_t N = batch.windows * seq_, H = model_.hidden_size;
  const int64_t F = model_.ffn_hidden_size / tp_.tp_size();
  {
    const TransferSite site = tp_site(layer_module(layer, "mlp.linear_fc1"),
                                      "ColumnParallelLinear: all-gather of the sequence-parallel input");
    norm_gather(x.data(), params[ids.pre_mlp_norm], batch.windows, a.h_mlp, a.rstd_mlp);
  }
  a.fc1 = buffer(N * 2 * F);
  backend_.linear_forward(a.h_mlp.data(), params[ids.fc1].data(), N, H, 2 * F, a.fc1.data());
  if (!tp_.sequence_parallel()) release(a.h_mlp);  // recomputed in the backward, as h_attn
  ActivationBuffer act = buffer(N * F);  // [N,Fl] silu(gate) * up, recomputed from fc1 in the backward
  backend_.swiglu_forward(a.fc1.data(), N, F, act.data());
  ActivationBuffer out_partial = buffer(N * H), out;
  backend_.linear_forward(act.data(), params[ids.fc2].data(), N, F, H, out_partial.data());
  release(act);
  {
    const TransferSite site =
        tp_site(layer_module(layer, "mlp.linear_fc2"), "RowParallelLinear: " + tp_reduce_words());
    tp_.reduce(out_partial, N, H, out);
  }
  hidden_dropout_forward(dropout_keys_[layer].hidden_mlp, batch, out, a.hidden_mlp_keep);
  keep_and_advance(x, out, a.x_mid);
}

void Transformer::mlp_block_backward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                                     LayerActivations& a, ActivationBuffer& dx, ParamTensors& grads,
                                     DeferredWeightGradients* deferred) const {
  const LayerParamIds& ids = table_.layer(layer);
  const int64_t N = batch.windows * seq_, Nl = tp_.local_rows(N), H = model_.hidden_size;
  const int64_t F = model_.ffn_hidden_size / tp_.tp_size();
  ActivationBuffer scratch, gathered;  // [Nl,H], [N,H]
  ActivationBuffer* dout = nullptr;    // [N,H] one of dx, scratch, gathered (row_parallel_output_grad)
  {
    const TransferSite site =
        tp_site(layer_module(layer, "mlp.linear_fc2"),
                "RowParallelLinear backward: all-gather of the sequence-parallel output gradient");
    dout = &row_parallel_output_grad(dx, N, a.hidden_mlp_keep, scratch, gathered, deferred);
  }
  release(a.hidden_mlp_keep);
  // fc2's input gradient first; its weight gradient needs act, which SwiGLU's backward gives again (the
  // forward's bits) over dact, element by element after reading it: no second SwiGLU forward.
  ActivationBuffer dact = buffer(N * F);  // [N,Fl], then act
  backend_.linear_backward(dout->data(), nullptr, params[ids.fc2].data(), N, F, H, dact.data(), nullptr);
  ActivationBuffer dfc1 = buffer(N * 2 * F);
  backend_.swiglu_backward(dact.data(), a.fc1.data(), N, F, dfc1.data(), dact.data());
  release(a.fc1);
  ActivationBuffer act = std::move(dact);
  linear_weight_gradient(*dout, act, N, F, H, grads[ids.fc2].data(), deferred);
  release(gathered);
  release(scratch);
  release(act);
  if (!tp_.sequence_parallel()) {  // h_mlp [N,H] again, as h_attn in the attention block
    ActivationBuffer rstd;
    norm_gather(a.x_mid.data(), params[ids.pre_mlp_norm], batch.windows, a.h_mlp, rstd);
  }
  ActivationBuffer dh_partial = buffer(N * H), dh;  // [N,H], [Nl,H]
  linear_backward(dfc1, a.h_mlp, params[ids.fc1].data(), N, H, 2 * F, dh_partial.data(),
                  grads[ids.fc1].data(), deferred);
  release(dfc1);
  release(a.h_mlp);
  {
    const TransferSite site =
        tp_site(layer_module(layer, "mlp.linear_fc1"),
                "ColumnParallelLinear backward: " + tp_reduce_words() + " of the input gradient");
    tp_.reduce(dh_partial, N, H, dh);
  }
  release(dh_partial);
  ActivationBuffer dnorm_in = buffer(Nl * H);
  backend_.rmsnorm_backward(dh.data(), a.x_mid.data(), params[ids.pre_mlp_norm].data(), a.rstd_mlp.data(), Nl,
                            H, dnorm_in.data(), grads[ids.pre_mlp_norm].data());
  for (ActivationBuffer* t : {&dh, &a.x_mid, &a.rstd_mlp}) release(*t);
  backend_.add_inplace(dx.data(), dnorm_in.data(), Nl * H);
}

}  // namespace touchstone
