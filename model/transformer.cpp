// Forward and backward of the decoder, block by block: each block's backward sits next to its forward.
#include "model/transformer.h"

namespace touchstone {

namespace {
std::vector<double> buffer(int64_t n) { return std::vector<double>(static_cast<size_t>(n)); }
}  // namespace

Transformer::Transformer(const ModelConfig& model, bool document_masking, const ParamTable& table,
                         Backend& backend)
    : model_(model), document_masking_(document_masking), table_(table), backend_(backend) {}

AttentionShape Transformer::attention_shape(int64_t windows) const {
  return AttentionShape{windows, model_.seq_length, model_.num_heads, model_.num_kv_heads, model_.head_dim()};
}

// ---- attention block: x += linear_proj(attention(RoPE(split(linear_qkv(RMSNorm(x)))))) ------------------

void Transformer::attention_block_forward(const ParamTensors& params, const LayerParamIds& ids,
                                          const MicroBatch& batch, LayerActivations& a,
                                          std::vector<double>& x) const {
  const AttentionShape s = attention_shape(batch.windows);
  const int64_t N = batch.windows * model_.seq_length, H = model_.hidden_size, D = s.head_dim;
  a.x_in = x;
  a.h_attn = buffer(N * H);
  a.rstd_attn = buffer(N);
  backend_.rmsnorm_forward(x.data(), params[ids.input_norm].data(), N, H, model_.norm_eps, a.h_attn.data(),
                           a.rstd_attn.data());
  std::vector<double> qkv = buffer(N * model_.qkv_rows());  // [N, (NH+2NKV)D]
  backend_.linear_forward(a.h_attn.data(), params[ids.qkv].data(), N, H, model_.qkv_rows(), qkv.data());
  a.q = buffer(N * s.num_heads * D);
  a.k = buffer(N * s.num_kv_heads * D);
  a.v = buffer(N * s.num_kv_heads * D);
  backend_.qkv_split(qkv.data(), s, a.q.data(), a.k.data(), a.v.data());
  backend_.rope(a.q.data(), batch.position_ids, s.windows, s.num_heads, s.seq, D, model_.rope_theta, false);
  backend_.rope(a.k.data(), batch.position_ids, s.windows, s.num_kv_heads, s.seq, D, model_.rope_theta, false);
  a.probs = buffer(s.windows * s.num_heads * s.seq * s.seq);
  a.attn = buffer(N * s.num_heads * D);
  backend_.attention_forward(a.q.data(), a.k.data(), a.v.data(), batch.document_ids, document_masking_, s,
                             a.attn.data(), a.probs.data());
  std::vector<double> proj = buffer(N * H);
  backend_.linear_forward(a.attn.data(), params[ids.proj].data(), N, s.num_heads * D, H, proj.data());
  backend_.add_inplace(x.data(), proj.data(), N * H);
}

void Transformer::attention_block_backward(const ParamTensors& params, const LayerParamIds& ids,
                                           const MicroBatch& batch, const LayerActivations& a,
                                           std::vector<double>& dx, ParamTensors& grads) const {
  const AttentionShape s = attention_shape(batch.windows);
  const int64_t N = batch.windows * model_.seq_length, H = model_.hidden_size, D = s.head_dim;
  std::vector<double> dattn = buffer(N * s.num_heads * D);
  backend_.linear_backward(dx.data(), a.attn.data(), params[ids.proj].data(), N, s.num_heads * D, H,
                           dattn.data(), grads[ids.proj].data());
  std::vector<double> dq = buffer(N * s.num_heads * D), dk = buffer(N * s.num_kv_heads * D),
                      dv = buffer(N * s.num_kv_heads * D);
  backend_.attention_backward(dattn.data(), a.q.data(), a.k.data(), a.v.data(), a.probs.data(), s, dq.data(),
                              dk.data(), dv.data());
  backend_.rope(dq.data(), batch.position_ids, s.windows, s.num_heads, s.seq, D, model_.rope_theta, true);
  backend_.rope(dk.data(), batch.position_ids, s.windows, s.num_kv_heads, s.seq, D, model_.rope_theta, true);
  std::vector<double> dqkv = buffer(N * model_.qkv_rows());
  backend_.qkv_merge(dq.data(), dk.data(), dv.data(), s, dqkv.data());
  std::vector<double> dh = buffer(N * H), dnorm_in = buffer(N * H);
  backend_.linear_backward(dqkv.data(), a.h_attn.data(), params[ids.qkv].data(), N, H, model_.qkv_rows(),
                           dh.data(), grads[ids.qkv].data());
  backend_.rmsnorm_backward(dh.data(), a.x_in.data(), params[ids.input_norm].data(), a.rstd_attn.data(), N, H,
                            dnorm_in.data(), grads[ids.input_norm].data());
  backend_.add_inplace(dx.data(), dnorm_in.data(), N * H);  // the residual branch joins the skip path
}

// ---- MLP block: x += linear_fc2(silu(gate) * up), [gate | up] = linear_fc1(RMSNorm(x)) -------------------

void Transformer::mlp_block_forward(const ParamTensors& params, const LayerParamIds& ids, int64_t N,
                                    LayerActivations& a, std::vector<double>& x) const {
  const int64_t H = model_.hidden_size, F = model_.ffn_hidden_size;
  a.x_mid = x;
  a.h_mlp = buffer(N * H);
  a.rstd_mlp = buffer(N);
  backend_.rmsnorm_forward(x.data(), params[ids.pre_mlp_norm].data(), N, H, model_.norm_eps, a.h_mlp.data(),
                           a.rstd_mlp.data());
  a.fc1 = buffer(N * 2 * F);
  backend_.linear_forward(a.h_mlp.data(), params[ids.fc1].data(), N, H, 2 * F, a.fc1.data());
  a.act = buffer(N * F);
  backend_.swiglu_forward(a.fc1.data(), N, F, a.act.data());
  std::vector<double> out = buffer(N * H);
  backend_.linear_forward(a.act.data(), params[ids.fc2].data(), N, F, H, out.data());
  backend_.add_inplace(x.data(), out.data(), N * H);
}

void Transformer::mlp_block_backward(const ParamTensors& params, const LayerParamIds& ids, int64_t N,
                                     const LayerActivations& a, std::vector<double>& dx,
                                     ParamTensors& grads) const {
  const int64_t H = model_.hidden_size, F = model_.ffn_hidden_size;
  std::vector<double> dact = buffer(N * F), dfc1 = buffer(N * 2 * F);
  backend_.linear_backward(dx.data(), a.act.data(), params[ids.fc2].data(), N, F, H, dact.data(),
                           grads[ids.fc2].data());
  backend_.swiglu_backward(dact.data(), a.fc1.data(), N, F, dfc1.data());
  std::vector<double> dh = buffer(N * H), dnorm_in = buffer(N * H);
  backend_.linear_backward(dfc1.data(), a.h_mlp.data(), params[ids.fc1].data(), N, H, 2 * F, dh.data(),
                           grads[ids.fc1].data());
  backend_.rmsnorm_backward(dh.data(), a.x_mid.data(), params[ids.pre_mlp_norm].data(), a.rstd_mlp.data(), N, H,
                            dnorm_in.data(), grads[ids.pre_mlp_norm].data());
  backend_.add_inplace(dx.data(), dnorm_in.data(), N * H);
}

// ---- whole model: embedding -> layers -> final norm -> output layer -> cross entropy ---------------------

void Transformer::forward(const ParamTensors& params, const MicroBatch& batch, Activations& acts) const {
  const int64_t N = batch.windows * model_.seq_length, H = model_.hidden_size, V = model_.vocab_size;
  std::vector<double> x = buffer(N * H);  // [N,H] the residual stream
  backend_.embedding_forward(batch.tokens, params[table_.embedding()].data(), N, H, x.data());
  acts.layers.resize(static_cast<size_t>(model_.num_layers));
  for (int64_t l = 0; l < model_.num_layers; ++l) {
    LayerActivations& a = acts.layers[static_cast<size_t>(l)];
    attention_block_forward(params, table_.layer(l), batch, a, x);
    mlp_block_forward(params, table_.layer(l), N, a, x);
  }
  acts.x_final = std::move(x);
  acts.rstd_final = buffer(N);
  acts.h_final = buffer(N * H);
  backend_.rmsnorm_forward(acts.x_final.data(), params[table_.final_norm()].data(), N, H, model_.norm_eps,
                           acts.h_final.data(), acts.rstd_final.data());
  acts.logits = buffer(N * V);
  backend_.linear_forward(acts.h_final.data(), params[table_.output()].data(), N, H, V, acts.logits.data());
  acts.token_losses = buffer(N);
  backend_.cross_entropy_forward(acts.logits.data(), batch.targets, N, V, acts.token_losses.data());
}

void Transformer::backward(const ParamTensors& params, const MicroBatch& batch, const Activations& acts,
                           double loss_weight, ParamTensors& grads) const {
  const int64_t N = batch.windows * model_.seq_length, H = model_.hidden_size, V = model_.vocab_size;
  std::vector<double> dlogits = buffer(N * V);
  backend_.cross_entropy_backward(acts.logits.data(), batch.targets, N, V, loss_weight, dlogits.data());
  std::vector<double> dh = buffer(N * H), dx = buffer(N * H);
  // With tied embeddings output() is the embedding, so both uses add into one gradient.
  backend_.linear_backward(dlogits.data(), acts.h_final.data(), params[table_.output()].data(), N, H, V,
                           dh.data(), grads[table_.output()].data());
  backend_.rmsnorm_backward(dh.data(), acts.x_final.data(), params[table_.final_norm()].data(),
                            acts.rstd_final.data(), N, H, dx.data(), grads[table_.final_norm()].data());
  for (int64_t l = model_.num_layers - 1; l >= 0; --l) {
    const LayerActivations& a = acts.layers[static_cast<size_t>(l)];
    mlp_block_backward(params, table_.layer(l), N, a, dx, grads);
    attention_block_backward(params, table_.layer(l), batch, a, dx, grads);
  }
  backend_.embedding_backward(batch.tokens, dx.data(), N, H, grads[table_.embedding()].data());
}

}  // namespace touchstone
