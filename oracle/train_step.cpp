// The single-process training step and the two loss normalisations.
#include "oracle/train_step.h"

#include <algorithm>

#include "model/errors.h"

namespace touchstone {

LossNormalization parse_loss_normalization(const std::string& name) {
  if (name == "global_token_mean") return LossNormalization::kGlobalTokenMean;
  if (name == "per_microbatch_mean") return LossNormalization::kPerMicrobatchMean;
  throw InputError("train.loss_normalization: unknown value \"" + name + "\"");
}

ObjectiveResult evaluate_objective(const Transformer& model, const ParamTable& table, const ParamTensors& params,
                                   const GlobalBatch& batch, int64_t micro_batch_size,
                                   LossNormalization normalization, bool with_gradients) {
  ObjectiveResult result;
  result.num_loss_tokens = batch.loss_tokens(0, batch.windows);
  result.token_losses.assign(static_cast<size_t>(batch.windows * batch.seq), 0.0);
  if (with_gradients) result.grads = ParamTensors::zeros_like(table);
  const int64_t num_micro_batches = batch.windows / micro_batch_size;
  Activations acts;
  for (int64_t j = 0; j < num_micro_batches; ++j) {
    const int64_t first = j * micro_batch_size;
    // d(objective) / d(token loss) for every loss token of this micro-batch. A micro-batch (or global
    // batch) without loss tokens divides by 1, as Megatron-LM does, so its weight is finite.
    const double weight =
        normalization == LossNormalization::kGlobalTokenMean
            ? 1.0 / static_cast<double>(std::max<int64_t>(result.num_loss_tokens, 1))
            : 1.0 / (static_cast<double>(std::max<int64_t>(batch.loss_tokens(first, micro_batch_size), 1)) *
                     static_cast<double>(num_micro_batches));
    const MicroBatch micro = batch.micro_batch(first, micro_batch_size);
    model.forward(params, micro, acts);
    double micro_loss_sum = 0.0;
    for (size_t n = 0; n < acts.token_losses.size(); ++n) {
      micro_loss_sum += acts.token_losses[n];
      result.token_losses[static_cast<size_t>(first * batch.seq) + n] = acts.token_losses[n];
    }
    result.loss += weight * micro_loss_sum;
    if (with_gradients) model.backward(params, micro, acts, weight, result.grads);
  }
  return result;
}

Trainer::Trainer(const Config& config, ParamTensors initial_params, Backend& backend)
    : config_(config),
      backend_(backend),
      table_(config.model),
      model_(config.model, config.data.document_masking, table_, backend),
      params_(std::move(initial_params)),
      optimizer_(AdamWState::zeros_like(table_)) {}

StepRecord Trainer::step(const GlobalBatch& batch) {
  StepRecord record;
  record.step = optimizer_.step + 1;
  record.objective = evaluate_objective(model_, table_, params_, batch, config_.train.micro_batch_size,
                                        parse_loss_normalization(config_.train.loss_normalization), true);
  record.grad_norm = global_grad_norm(record.objective.grads);
  record.clip_coefficient = clip_coefficient(record.grad_norm, config_.optim.clip_grad);
  record.lr = learning_rate(config_.optim, record.step);
  adamw_step(backend_, table_, config_.optim, record.lr, record.clip_coefficient, record.objective.grads, params_,
             optimizer_);
  return record;
}

}  // namespace touchstone
