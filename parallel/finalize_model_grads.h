// finalize_model_grads (Megatron-Core's name for the same step): the gradient reductions between the
// backward and the optimizer that the model's layout itself needs.
//
//   sequence parallelism   the norm weights' gradients are partial sums over each tp rank's rows:
//                          all-reduce them over tp (without it every tp rank computed the full gradient)
//   tied embeddings, pp>1  the embedding lives on the first and the last stage, each holding the
//                          gradient of one use: all-reduce over the embedding group, both get the sum
//
// The data-parallel reduction is not here: DataParallelOptimizer::step makes it (as Megatron-Core's
// DistributedDataParallel does), since with the distributed optimizer it is a reduce-scatter into the
// optimizer's own chunk. Each sum is stored as an FP32 main gradient unless FP64 (docs/precision.md).
#pragma once

#include "kernels/backend.h"
#include "model/param_table.h"
#include "parallel/comm/context.h"
#include "parallel/shard_plan.h"

namespace touchstone {

// `grads` holds the gradients of the tensors this rank holds (`plan`), accumulated over its
// micro-batches (full tensors, or their dim-0 shards over dp at zero stage 3: the same reductions apply
// to each shard); on return those that the layout splits are complete.
void finalize_model_grads(const ShardPlan& plan, const ParallelContext& context, bool sequence_parallel,
                          bool tie_embeddings, Backend& backend, ParamTensors& grads);

}  // namespace touchstone
