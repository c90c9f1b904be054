// The split backward of ZB-H1 (docs/parallelism.md): Transformer::linear_backward computes a linear
// layer's input gradient now and, when the backward is split, keeps what its weight gradient needs in a
// DeferredWeightGradients (model/transformer.h); Transformer::backward_weights runs those calls later,
// the W of the schedule, unit by unit so that the parameter hooks (ZeRO-3) learn when a unit's
// gradients are complete.
#include <algorithm>
#include <stdexcept>

#include "model/transformer.h"

namespace touchstone {

void Transformer::linear_backward(ActivationBuffer& dy, const ActivationBuffer& x, const double* weight,
                                  int64_t rows, int64_t in, int64_t out, double* dx, double* dweight,
                                  DeferredWeightGradients* deferred) const {
  if (deferred == nullptr) {
    backend_.linear_backward(dy.data(), x.data(), weight, rows, in, out, dx, dweight);
    return;
  }
  backend_.linear_backward(dy.data(), x.data(), weight, rows, in, out, dx, nullptr);
  // x is still needed after this call in some blocks (attention's output, for the softmax backward),
  // so W keeps a copy; dy is done with here.
  ActivationBuffer x_kept(static_cast<size_t>(rows * in));
  std::copy_n(x.data(), rows * in, x_kept.data());
  deferred->linears.push_back(
      {std::move(dy), std::move(x_kept), rows, in, out, dweight, deferred->units.size() - 1});
}

void Transformer::linear_weight_gradient(ActivationBuffer& dy, ActivationBuffer& x, int64_t rows, int64_t in,
                                         int64_t out, double* dweight,
                                         DeferredWeightGradients* deferred) const {
  if (deferred == nullptr) {
    backend_.linear_backward(dy.data(), x.data(), nullptr, rows, in, out, nullptr, dweight);
    return;
  }
  deferred->linears.push_back(
      {std::move(dy), std::move(x), rows, in, out, dweight, deferred->units.size() - 1});
}

void Transformer::backward_weights(DeferredWeightGradients& deferred) const {
  // Unit by unit, in the backward's order (the records are in that order), so the hooks learn as soon
  // as a unit's gradients hold this micro-batch's W.
  size_t next_linear = 0, next_embedding = 0;
  for (size_t unit = 0; unit < deferred.units.size(); ++unit) {
    for (; next_linear < deferred.linears.size() && deferred.linears[next_linear].unit == unit;
         ++next_linear) {
      DeferredWeightGradients::Linear& call = deferred.linears[next_linear];
      backend_.linear_backward(call.dy.data(), call.x.data(), nullptr, call.rows, call.in, call.out, nullptr,
                               call.dweight);
    }
    for (; next_embedding < deferred.embedding.size() && deferred.embedding[next_embedding].unit == unit;
         ++next_embedding) {
      DeferredWeightGradients::Embedding& call = deferred.embedding[next_embedding];
      backend_.embedding_backward(call.tokens, call.dy.data(), call.rows, model_.hidden_size, vocab_start(),
                                  vocab_local(), call.dtable);
    }
    if (hooks_ != nullptr) hooks_->after_weight_gradients(deferred.units[unit]);
  }
  if (next_linear != deferred.linears.size() || next_embedding != deferred.embedding.size()) {
    throw std::logic_error("backward_weights: a deferred call names no unit of the backward");
  }
  deferred = {};
}

}  // namespace touchstone
