// The "Touchstone FP64 trainer" activation model: replays, allocation by allocation, what one training
// step of Touchstone's own trainer (model/transformer.cpp, parallel/pipeline/executor.cpp,
// oracle/train_step.cpp, parallel/data/data_parallel_optimizer.cpp) keeps alive on one rank, and
// reports the largest live total beyond the model state. Every buffer is FP64 (8 bytes per element).
// The replay mirrors the order of the code it predicts; when that code changes its buffers, this file
// changes with it, and test_plan_memory (measured peak against this prediction) says so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "tools/plan/memory_model.h"
#include "tools/plan/memory_plan.h"

namespace touchstone::plan {

// One rank of the grid: tensor-parallel rank 0 and data-parallel rank 0 of pipeline stage `stage`.
struct Fp64Rank {
  ModelShape shape;
  int64_t micro_batch = 1;    // b windows of shape.seq tokens
  int64_t micro_batches = 1;  // per replica per update
  int64_t tp = 1, pp = 1, dp = 1, stage = 0;
  int64_t first_layer = 0, layers = 0;
  bool sequence_parallel = false, distributed_optimizer = false;
  // Trainer::step's collect_outputs (its default, and golden runs): world rank 0 assembles the token
  // losses of the global batch, and the distributed optimizer gathers the whole summed gradient.
  bool collect_outputs = true;
  double params = 0;  // parameters this rank holds
};

struct Fp64StepReplay {
  double stored_per_micro_batch = 0;  // bytes one micro-batch keeps from its forward to its backward
  NamedBytes peak;                    // largest live bytes beyond the model state, and where in the step
  std::vector<NamedBytes> stored_per_layer;  // one layer's stored tensors
  std::vector<NamedBytes> stored_head;       // stage output, and the head's on the last stage
};

Fp64StepReplay replay_fp64_step(const Fp64Rank& rank);

// The planner input that describes a Touchstone run's config (shapes, batch, layout, fp64 recipe).
MemoryPlanInput plan_input_from_config(const Config& config);

// The predicted peak of one Trainer::step of a single-process run, model state included, in bytes.
struct StepPeakPrediction {
  ModelState state;
  StageMemory stage;
  double total = 0;
};
StepPeakPrediction predict_single_process_step(const Config& config);

}  // namespace touchstone::plan
