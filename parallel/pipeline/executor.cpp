// The schedule executor: one switch over the action kinds. Tags keep transfers of different
// micro-batches and model chunks apart (parallel/comm/message_tags.h).
#include "parallel/pipeline/executor.h"

#include <stdexcept>
#include <string>

#include "parallel/comm/message_tags.h"
#include "parallel/pipeline/schedule.h"

namespace touchstone {

using pipeline::ActionKind;

namespace {

bool is_backward_kind(ActionKind kind) {
  return kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput ||
         kind == ActionKind::kBackwardWeight || kind == ActionKind::kSendGradient ||
         kind == ActionKind::kRecvGradient;
}

// The stage's list: the configured schedule, interleaved 1F1B with several chunks, and all forwards
// first when only the forward passes run. Without its backwards the interleaved list still runs: each
// forward waits only for forwards, which every stage reaches at least as early as with the backwards.
std::vector<pipeline::Action> stage_actions(PipelineSchedule schedule, int num_chunks, int num_stages,
                                            int stage, int m, bool with_gradients) {
  if (num_chunks > 1) return pipeline::build_interleaved_schedule(num_stages, num_chunks, stage, m);
  return pipeline::build_schedule(with_gradients ? schedule : PipelineSchedule::kAllForwardAllBackward,
                                  num_stages, stage, m);
}

}  // namespace

PipelineResult run_pipeline(PipelineSchedule schedule, const ModelChunks& chunks, const ParamTensors& params,
                            const std::vector<MicroBatch>& micro_batches,
                            const std::vector<double>& loss_weights,
                            const std::vector<double>& backward_weights, const ParallelContext& context,
                            int64_t step, bool with_gradients, ParamTensors& grads,
                            pipeline::TimelineRecorder* recorder) {
  const auto m = static_cast<int>(micro_batches.size());
  const auto v = static_cast<int>(chunks.size());
  const std::vector<pipeline::Action> actions =
      stage_actions(schedule, v, context.pp.size(), context.stage(), m, with_gradients);
  const int64_t H = chunks.front()->hidden_size();

  // Per (chunk, micro-batch), index chunk * m + j:
  const auto n = static_cast<size_t>(v * m);
  std::vector<Activations> acts(n);
  std::vector<ActivationBuffer> inputs(n);           // received activations
  std::vector<ActivationBuffer> d_outputs(n);        // received gradients
  std::vector<ActivationBuffer> d_inputs(n);         // gradients to send back
  std::vector<DeferredWeightGradients> deferred(n);  // a split backward's W half
  PipelineResult result;
  if (context.last_stage()) result.token_losses.resize(static_cast<size_t>(m));

  for (const pipeline::Action& action : actions) {
    if (!with_gradients && is_backward_kind(action.kind)) continue;
    const Transformer& model = *chunks[static_cast<size_t>(action.chunk)];
    const StageRange& range = model.stage();  // the pipeline's first or last virtual stage, or neither
    const auto j = static_cast<size_t>(action.micro_batch);
    const auto k = static_cast<size_t>(action.chunk) * static_cast<size_t>(m) + j;
    const int trace_chunk = v > 1 ? action.chunk : -1;  // trace lines name the chunk when there are several
    const MicroBatch& batch = micro_batches[j];
    const int64_t rows = model.local_rows(batch.windows);
    const Shape shape{rows, H};
    const pipeline::TimelineRecorder::Scope event(recorder, action.kind, action.micro_batch, action.chunk);
    const auto receive = [&](ActivationBuffer& buffer, int tag, const char* what) {
      buffer.resize(static_cast<size_t>(rows * H));
      const TransferSite site(
          context.pp, std::string("pipeline ") + what + " stage " + std::to_string(action.peer_stage));
      context.pp.recv(buffer.data(), rows * H, action.peer_stage, tag, shape);
    };
    switch (action.kind) {
      case ActionKind::kRecvActivation:
        context.set_phase(step, action.micro_batch, "forward", trace_chunk);
        receive(inputs[k], message_tags::pipeline_activation(action.micro_batch, action.chunk, v),
                "recv_forward: the input activation from");
        break;
      case ActionKind::kForward:
        context.set_phase(step, action.micro_batch, "forward", trace_chunk);
        model.forward(params, batch, range.first_stage ? nullptr : &inputs[k], acts[k]);
        // A new empty vector frees the buffer; `= {}` would assign an empty list and keep the capacity.
        inputs[k] = ActivationBuffer();
        if (range.last_stage) {
          double sum = 0.0;
          for (double loss : acts[k].token_losses) sum += loss;
          result.weighted_loss += loss_weights[j] * sum;
          result.token_losses[j].assign(acts[k].token_losses.begin(), acts[k].token_losses.end());
        }
        // Without a backward the activations are done with once the next stage has them.
        if (!with_gradients && range.last_stage) acts[k] = {};
        break;
      case ActionKind::kSendActivation:
        context.set_phase(step, action.micro_batch, "forward", trace_chunk);
        {
          const TransferSite site(context.pp, "pipeline send_forward: the output activation to stage " +
                                                  std::to_string(action.peer_stage));
          context.pp.send(acts[k].x_final.data(), rows * H, action.peer_stage,
                          message_tags::pipeline_activation(action.micro_batch, action.peer_chunk, v), shape);
        }
        if (!with_gradients) acts[k] = {};  // the send copied what it needs
        break;
      case ActionKind::kRecvGradient:
        context.set_phase(step, action.micro_batch, "backward", trace_chunk);
        receive(d_outputs[k], message_tags::pipeline_gradient(action.micro_batch, action.chunk, v),
                "recv_backward: the output gradient from");
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        // A split backward (I) leaves the weight gradients in deferred[k] for its W.
        context.set_phase(step, action.micro_batch, "backward", trace_chunk);
        model.backward(params, batch, acts[k], backward_weights[j],
                       range.last_stage ? nullptr : &d_outputs[k], grads,
                       range.first_stage ? nullptr : &d_inputs[k],
                       action.kind == ActionKind::kBackwardInput ? &deferred[k] : nullptr);
        acts[k] = {};
        d_outputs[k] = ActivationBuffer();
        break;
      case ActionKind::kBackwardWeight:
        context.set_phase(step, action.micro_batch, "backward weights", trace_chunk);
        model.backward_weights(deferred[k]);
        break;
      case ActionKind::kSendGradient:
        context.set_phase(step, action.micro_batch, "backward", trace_chunk);
        {
          const TransferSite site(context.pp, "pipeline send_backward: the input gradient to stage " +
                                                  std::to_string(action.peer_stage));
          context.pp.send(d_inputs[k].data(), rows * H, action.peer_stage,
                          message_tags::pipeline_gradient(action.micro_batch, action.peer_chunk, v), shape);
        }
        break;
      case ActionKind::kContextTransfer:  // recorded within attention, never scheduled
        throw std::logic_error("pipeline executor: a schedule holds a context-parallel transfer");
    }
  }
  context.pp.wait_sends();
  // Gradients are final only when every W has run: the caller reduces and steps on them next.
  for (size_t k = 0; k < deferred.size(); ++k) {
    if (!deferred[k].empty()) {
      throw std::logic_error("pipeline executor: the weight gradients of micro-batch " +
                             std::to_string(k % static_cast<size_t>(m)) +
                             " never ran; the schedule lacks its W");
    }
  }
  return result;
}

}  // namespace touchstone
