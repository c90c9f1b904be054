// Forward and backward of the decoder: the embedding, the head and one stage's pass over its layers here,
// the layers' attention and MLP blocks in layer_blocks.cpp; each block's backward sits next to its forward.
// Shapes: N = b*T rows of the full sequence (b*T/cp with context parallelism: this rank's chunks), Nl =
// rows of the residual stream on this rank, NHl, NKVl, Fl, Vl = this tp rank's heads, KV heads, ffn
// columns and vocabulary rows.
#include "model/transformer.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/transformer_helpers.h"

namespace touchstone {

using model::buffer;
using model::layer_module;
using model::release;

TransferSite Transformer::tp_site(const std::string& module, const std::string& operation) const {
  return TransferSite(tp_.group(), module + " " + operation);
}

std::string Transformer::tp_reduce_words() const {
  return tp_.sequence_parallel() ? "reduce-scatter of partial sums" : "all-reduce of partial sums";
}

LayerDropoutKeys layer_dropout_keys(int64_t seed, int64_t layer) {
  const auto s = static_cast<uint64_t>(seed);
  const std::string suffix = "/layer" + std::to_string(layer);
  return {stream_key(s, "dropout/attention" + suffix), stream_key(s, "dropout/hidden_attn" + suffix),
          stream_key(s, "dropout/hidden_mlp" + suffix)};
}

Transformer::Transformer(const ModelConfig& model, bool document_masking, int64_t dropout_seed,
                         const ParamTable& table, Backend& backend, const TensorParallelRegion& tp,
                         const StageRange& stage, const ContextParallelAttention* cp)
    : model_(model),
      document_masking_(document_masking),
      table_(table),
      backend_(backend),
      tp_(tp),
      stage_(stage),
      cp_(cp),
      seq_(cp == nullptr ? model.seq_length : model.seq_length / cp->cp_size()) {
  for (int64_t l = 0; l < model.num_layers; ++l) dropout_keys_.push_back(layer_dropout_keys(dropout_seed, l));
}

AttentionShape Transformer::attention_shape(int64_t windows) const {
  const int64_t t = tp_.tp_size();
  return AttentionShape{windows, seq_, model_.num_heads / t, model_.num_kv_heads / t, model_.head_dim()};
}

void Transformer::norm_gather(const double* x, const std::vector<double>& weight, int64_t windows,
                              ActivationBuffer& h, ActivationBuffer& rstd) const {
  const int64_t N = windows * seq_, Nl = tp_.local_rows(N), H = model_.hidden_size;
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
  const int64_t N = batch.windows * seq_, Nl = tp_.local_rows(N), H = model_.hidden_size;
  keep = buffer(Nl * H);
  // With sequence parallelism this rank holds rows [first_local_row, + Nl) of the N rows: their mask is
  // drawn at their global rows, so the blocks of all ranks form the single-rank mask. With context
  // parallelism those rows are positions of the window (MicroBatch::window_positions), drawn one run of
  // consecutive positions at a time.
  const DropoutSite site = dropout_site(key, model_.hidden_dropout, batch);
  const int64_t first = tp_.first_local_row(N), T = model_.seq_length;
  if (batch.window_positions == nullptr) {
    backend_.hidden_dropout_mask(site, first, Nl, T, H, keep.data());
  } else {
    for (int64_t row = first; row < first + Nl;) {
      const int64_t window = row / seq_, position = batch.window_positions[row];
      int64_t run = 1;  // rows continuing the same window's positions one by one
      while (row + run < first + Nl && (row + run) / seq_ == window &&
             batch.window_positions[row + run] == position + run)
        ++run;
      backend_.hidden_dropout_mask(site, window * T + position, run, T, H, keep.data() + (row - first) * H);
      row += run;
    }
  }
  backend_.dropout_forward(out.data(), keep.data(), Nl * H, out.data());
}

void Transformer::keep_and_advance(ActivationBuffer& x, ActivationBuffer& branch,
                                   ActivationBuffer& kept) const {
  backend_.add_inplace(branch.data(), x.data(), static_cast<int64_t>(x.size()));
  kept = std::move(x);
  x = std::move(branch);
}

ActivationBuffer& Transformer::hidden_dropout_backward(ActivationBuffer& dx, const ActivationBuffer& keep,
                                                       ActivationBuffer& scratch) const {
  if (keep.empty()) return dx;
  scratch = buffer(static_cast<int64_t>(dx.size()));
  backend_.dropout_backward(dx.data(), keep.data(), static_cast<int64_t>(dx.size()), scratch.data());
  return scratch;
}

ActivationBuffer& Transformer::row_parallel_output_grad(ActivationBuffer& dx, int64_t N,
                                                        const ActivationBuffer& keep,
                                                        ActivationBuffer& scratch, ActivationBuffer& full,
                                                        const DeferredWeightGradients* deferred) const {
  ActivationBuffer& local = hidden_dropout_backward(dx, keep, scratch);
  if (!tp_.sequence_parallel() && deferred == nullptr) return local;  // the identity gather
  tp_.gather(local, N, model_.hidden_size, full);
  return full;
}

// ---- head (last stage): final norm -> vocab-parallel output layer -> vocab-parallel cross entropy --------

void Transformer::head_forward(const ParamTensors& params, const MicroBatch& batch, Activations& acts) const {
  const int64_t N = batch.windows * seq_, H = model_.hidden_size;
  const int64_t V = vocab_local();
  ProcessGroup& tp = tp_.group();
  {
    const TransferSite site = tp_site(
        "output_layer", "ColumnParallelLinear: all-gather of the final norm's sequence-parallel output");
    norm_gather(acts.x_final.data(), params[table_.final_norm()], batch.windows, acts.h_final,
                acts.rstd_final);
  }
  // Megatron-LM's vocab_parallel_cross_entropy: three all-reduces over tp, the logits never gathered.
  const TransferSite site = tp_site("output_layer",
                                    "vocab-parallel cross entropy: all-reduce of row max, "
                                    "target logit and sum of exponentials");
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
  const int64_t N = batch.windows * seq_, Nl = tp_.local_rows(N), H = model_.hidden_size;
  const int64_t V = vocab_local();
  // dlogits take the logits' place, written over them in one call, so that two [N,Vl] buffers (the largest
  // at long T) are never alive at once.
  backend_.cross_entropy_backward(acts.logits.data(), batch.targets, N, V, vocab_start(), acts.row_max.data(),
                                  acts.sum_exp.data(), loss_weight, acts.logits.data());
  ActivationBuffer dlogits = std::move(acts.logits);  // [N,Vl]
  release(acts.row_max);
  release(acts.sum_exp);
  ActivationBuffer dh_partial = buffer(N * H), dh;  // [N,H], [Nl,H]
  // With tied embeddings output() is the embedding, so both uses add into one gradient.
  linear_backward(dlogits, acts.h_final, params[table_.output()].data(), N, H, V, dh_partial.data(),
                  grads[table_.output()].data(), deferred);
  release(dlogits);
  release(acts.h_final);
  {
    const TransferSite site = tp_site(
        "output_layer", "ColumnParallelLinear backward: " + tp_reduce_words() + " of the input gradient");
    tp_.reduce(dh_partial, N, H, dh);
  }
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
  const int64_t N = batch.windows * seq_, H = model_.hidden_size;
  ActivationBuffer x;  // [Nl,H] the residual stream
  if (stage_.first_stage) {
    before(kForward, {ParameterUnit::Kind::kEmbedding});
    ActivationBuffer partial = buffer(N * H);  // VocabParallelEmbedding: rows outside the slice are 0
    backend_.embedding_forward(batch.tokens, params[table_.embedding()].data(), N, H, vocab_start(),
                               vocab_local(), partial.data());
    after(kForward, {ParameterUnit::Kind::kEmbedding});
    {
      const TransferSite site = tp_site("embedding.word_embeddings",
                                        "VocabParallelEmbedding: " + tp_reduce_words() + " of the lookups");
      tp_.reduce(partial, N, H, x);
    }
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
  const int64_t N = batch.windows * seq_, H = model_.hidden_size;
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
    {
      const TransferSite site =
          tp_site("embedding.word_embeddings",
                  "VocabParallelEmbedding backward: all-gather of the sequence-parallel output gradient");
      if (tp_.sequence_parallel()) {
        tp_.gather(dx, N, H, dfull);
      } else {
        dfull = std::move(dx);  // the identity gather; dx has no use after this
      }
    }
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
