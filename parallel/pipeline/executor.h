// Runs one pipeline stage's schedule (parallel/pipeline/schedule.h) for one step: the forward and
// backward passes of this data-parallel rank's micro-batches, with activations sent to the next stage
// and their gradients sent back. The schedule is data computed beforehand; this loop only follows it,
// and records what actually ran in a TimelineRecorder. A split backward (ZB-H1) runs its I half with
// the model's DeferredWeightGradients and its W half later; every W has run when it returns. With
// virtual stages the stage runs interleaved 1F1B over its model chunks, one Transformer each.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/options.h"
#include "model/transformer.h"
#include "parallel/comm/context.h"
#include "parallel/pipeline/timeline.h"

namespace touchstone {

// This stage's model chunks, index = chunk (one without virtual stages); each Transformer's StageRange
// says whether it is the pipeline's first virtual stage (embedding, no input to receive) or its last
// (head and loss, no gradient to receive).
using ModelChunks = std::vector<const Transformer*>;

struct PipelineResult {
  // Last stage only: per micro-batch, its token losses [b*T] and sum_n weight * loss[n].
  std::vector<std::vector<double>> token_losses;
  double weighted_loss = 0.0;
};

// `loss_weights[j]` is d(objective) / d(token loss) for micro-batch j (it weights the loss value);
// `backward_weights[j]` is the weight micro-batch j's backward starts from (the cross entropy backward's
// incoming gradient; see LossScaling in oracle/train_step.h). Without gradients only the forward passes
// run (all-forward order), for evaluating the objective alone. `schedule` applies with one chunk;
// several chunks run build_interleaved_schedule (parallel.virtual_stages requires "1f1b").
PipelineResult run_pipeline(PipelineSchedule schedule, const ModelChunks& chunks, const ParamTensors& params,
                            const std::vector<MicroBatch>& micro_batches,
                            const std::vector<double>& loss_weights,
                            const std::vector<double>& backward_weights, const ParallelContext& context,
                            int64_t step, bool with_gradients, ParamTensors& grads,
                            pipeline::TimelineRecorder* recorder);

}  // namespace touchstone
