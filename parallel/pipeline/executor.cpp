// The schedule executor: one switch over the action kinds. Tags keep transfers of different
// micro-batches apart (parallel/comm/message_tags.h).
#include "parallel/pipeline/executor.h"

#include <stdexcept>

#include "parallel/comm/message_tags.h"
#include "parallel/pipeline/schedule.h"

namespace touchstone {

using pipeline::ActionKind;

PipelineResult run_pipeline(PipelineSchedule schedule, const Transformer& model, const ParamTensors& params,
                            const std::vector<MicroBatch>& micro_batches,
                            const std::vector<double>& loss_weights,
                            const std::vector<double>& backward_weights, const ParallelContext& context,
                            int64_t step, bool with_gradients, ParamTensors& grads,
                            pipeline::TimelineRecorder* recorder) {
  const auto m = static_cast<int>(micro_batches.size());
  const int num_stages = context.pp.size(), stage = context.stage();
  const std::vector<pipeline::Action> actions = pipeline::build_schedule(
      with_gradients ? schedule : PipelineSchedule::kAllForwardAllBackward, num_stages, stage, m);
  const int64_t H = model.hidden_size();

  std::vector<Activations> acts(static_cast<size_t>(m));
  std::vector<ActivationBuffer> inputs(static_cast<size_t>(m));           // received activations
  std::vector<ActivationBuffer> d_outputs(static_cast<size_t>(m));        // received gradients
  std::vector<ActivationBuffer> d_inputs(static_cast<size_t>(m));         // gradients to send back
  std::vector<DeferredWeightGradients> deferred(static_cast<size_t>(m));  // a split backward's W half
  PipelineResult result;
  if (context.last_stage()) result.token_losses.resize(static_cast<size_t>(m));

  for (const pipeline::Action& action : actions) {
    const bool backward_kind =
        action.kind == ActionKind::kBackward || action.kind == ActionKind::kBackwardInput ||
        action.kind == ActionKind::kBackwardWeight || action.kind == ActionKind::kSendGradient ||
        action.kind == ActionKind::kRecvGradient;
    if (!with_gradients && backward_kind) continue;
    const auto j = static_cast<size_t>(action.micro_batch);
    const MicroBatch& batch = micro_batches[j];
    const int64_t rows = model.local_rows(batch.windows);
    const Shape shape{rows, H};
    const pipeline::TimelineRecorder::Scope event(recorder, action.kind, action.micro_batch);
    const auto receive = [&](ActivationBuffer& buffer, int tag) {
      buffer.resize(static_cast<size_t>(rows * H));
      context.pp.recv(buffer.data(), rows * H, action.peer_stage, tag, shape);
    };
    switch (action.kind) {
      case ActionKind::kRecvActivation:
        context.set_phase(step, action.micro_batch, "forward");
        receive(inputs[j], message_tags::pipeline_activation(action.micro_batch));
        break;
      case ActionKind::kForward:
        context.set_phase(step, action.micro_batch, "forward");
        model.forward(params, batch, context.first_stage() ? nullptr : &inputs[j], acts[j]);
        // A new empty vector frees the buffer; `= {}` would assign an empty list and keep the capacity.
        inputs[j] = ActivationBuffer();
        if (context.last_stage()) {
          double sum = 0.0;
          for (double loss : acts[j].token_losses) sum += loss;
          result.weighted_loss += loss_weights[j] * sum;
          result.token_losses[j].assign(acts[j].token_losses.begin(), acts[j].token_losses.end());
        }
        // Without a backward the activations are done with once the next stage has them.
        if (!with_gradients && context.last_stage()) acts[j] = {};
        break;
      case ActionKind::kSendActivation:
        context.set_phase(step, action.micro_batch, "forward");
        context.pp.send(acts[j].x_final.data(), rows * H, action.peer_stage,
                        message_tags::pipeline_activation(action.micro_batch), shape);
        if (!with_gradients) acts[j] = {};  // the send copied what it needs
        break;
      case ActionKind::kRecvGradient:
        context.set_phase(step, action.micro_batch, "backward");
        receive(d_outputs[j], message_tags::pipeline_gradient(action.micro_batch));
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        // A split backward (I) leaves the weight gradients in deferred[j] for its W.
        context.set_phase(step, action.micro_batch, "backward");
        model.backward(params, batch, acts[j], backward_weights[j],
                       context.last_stage() ? nullptr : &d_outputs[j], grads,
                       context.first_stage() ? nullptr : &d_inputs[j],
                       action.kind == ActionKind::kBackwardInput ? &deferred[j] : nullptr);
        acts[j] = {};
        d_outputs[j] = ActivationBuffer();
        break;
      case ActionKind::kBackwardWeight:
        context.set_phase(step, action.micro_batch, "backward weights");
        model.backward_weights(deferred[j]);
        break;
      case ActionKind::kSendGradient:
        context.set_phase(step, action.micro_batch, "backward");
        context.pp.send(d_inputs[j].data(), rows * H, action.peer_stage,
                        message_tags::pipeline_gradient(action.micro_batch), shape);
        break;
    }
  }
  context.pp.wait_sends();
  // Gradients are final only when every W has run: the caller reduces and steps on them next.
  for (size_t j = 0; j < deferred.size(); ++j) {
    if (!deferred[j].empty()) {
      throw std::logic_error("pipeline executor: the weight gradients of micro-batch " + std::to_string(j) +
                             " never ran; the schedule lacks its W");
    }
  }
  return result;
}

}  // namespace touchstone
