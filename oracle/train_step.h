// One training step on one process, in the order of DESIGN.md: micro-batches -> forward/backward with
// gradient accumulation -> loss normalisation -> global norm and clipping -> AdamW.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/config.h"
#include "model/param_table.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "oracle/global_batch.h"

namespace touchstone {

enum class LossNormalization {
  kGlobalTokenMean,    // sum of token losses over the global batch / loss tokens in the global batch
  kPerMicrobatchMean,  // mean over micro-batches of (micro-batch token-loss sum / max(its count, 1))
};
LossNormalization parse_loss_normalization(const std::string& name);

// The objective of one global batch and (optionally) its gradient.
struct ObjectiveResult {
  double loss = 0.0;               // the objective whose gradient is `grads`
  int64_t num_loss_tokens = 0;     // whole global batch
  std::vector<double> token_losses;  // [B*T] cross entropy per position, 0 where no loss
  ParamTensors grads;              // empty unless requested
};

// Runs the micro-batches of `batch` (micro_batch_size windows each, in order) and accumulates the
// gradient of the objective. Each micro-batch's token losses are weighted so that the sum over
// micro-batches is the objective itself; no rescaling happens after accumulation.
ObjectiveResult evaluate_objective(const Transformer& model, const ParamTable& table, const ParamTensors& params,
                                   const GlobalBatch& batch, int64_t micro_batch_size,
                                   LossNormalization normalization, bool with_gradients);

struct StepRecord {
  int64_t step = 0;  // 1-based update number
  ObjectiveResult objective;
  double grad_norm = 0.0;  // before clipping
  double clip_coefficient = 1.0;
  double lr = 0.0;
};

// Owns the parameters and optimizer state of a single-process run.
class Trainer {
 public:
  Trainer(const Config& config, ParamTensors initial_params, Backend& backend);
  Trainer(const Trainer&) = delete;  // model_ refers to table_
  Trainer& operator=(const Trainer&) = delete;

  StepRecord step(const GlobalBatch& batch);

  const ParamTable& table() const { return table_; }
  const ParamTensors& params() const { return params_; }
  const AdamWState& optimizer_state() const { return optimizer_; }
  const Transformer& model() const { return model_; }

 private:
  Config config_;
  Backend& backend_;
  ParamTable table_;
  Transformer model_;
  ParamTensors params_;
  AdamWState optimizer_;
};

}  // namespace touchstone
