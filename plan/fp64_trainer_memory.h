// The "Touchstone FP64 trainer" activation model: replays, allocation by allocation, what training
// steps of Touchstone's own trainer (model/transformer.cpp, parallel/pipeline/executor.cpp,
// oracle/train_step.cpp, parallel/data/data_parallel_optimizer.cpp, and the communication layer's own
// buffers in parallel/comm/mpi_group.cpp) keep alive on one rank of the grid, and reports the largest live
// total beyond the model state. Every buffer is FP64 (8 bytes per element). The replay mirrors the
// order of the code it predicts; when that code changes its buffers, this file changes with it, and
// test_plan_memory (one process) and memory_per_rank (every rank of MPI layouts), which compare the
// prediction with measured peaks, say so.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "plan/buffer_tally.h"
#include "plan/comm_staging.h"
#include "plan/memory_model.h"
#include "plan/memory_plan.h"

namespace touchstone::plan {

// A parameter tensor one rank holds (its local shard), in parameter-table order (ShardPlan).
struct HeldTensor {
  double numel = 0;
  bool replicated = false;  // a norm weight: whole on every tp rank
  bool embedding = false;   // the embedding (also the last stage's output layer when tied)
  double rows = 1;          // dim 0 of the local shape (zero stages 2 and 3 shard along it)
  int64_t layer = -1;       // the decoder layer it belongs to; -1 outside the layers
  bool head = false;        // the final norm or the output layer (the head unit of zero stage 3)
};

// A model chunk of a stage (parallel/shard_plan.h): its layers, and whether it is the pipeline's first
// virtual stage (it embeds) or its last (it runs the head). Without virtual stages a stage is one chunk.
struct Fp64Chunk {
  int64_t first_layer = 0, layers = 0;
  bool first = false, last = false;
};

// One rank of the grid: tensor-parallel rank tp_rank, context-parallel rank cp_rank and data-parallel
// rank dp_rank of pipeline stage `stage`.
struct Fp64Rank {
  ModelShape shape;
  int64_t micro_batch = 1;    // b windows of shape.seq tokens
  int64_t micro_batches = 1;  // per replica per update
  int64_t tp = 1, pp = 1, dp = 1, cp = 1;
  int64_t tp_rank = 0, dp_rank = 0, stage = 0, cp_rank = 0;
  // How the context-parallel attention moves keys and values (parallel/context/context_attention.h).
  CpComm cp_comm = CpComm::kP2p;
  std::vector<Fp64Chunk> chunks;                                         // [virtual_stages]
  PipelineSchedule schedule = PipelineSchedule::kOneForwardOneBackward;  // parallel/pipeline/schedule.h
  bool sequence_parallel = false, distributed_optimizer = false;
  int64_t zero_stage = 0;        // parallel.zero_stage (1 when only distributed_optimizer is set)
  bool hidden_dropout = false;   // hidden dropout masks kept to the backward
  bool moments_dropped = false;  // MemoryPlanInput::moments_dropped: one step, moments in scratch pieces
  // The CPU kernels' threads (kernels/cpu/parallel_for.h): each holds its own attention tile scratch.
  int64_t kernel_threads = 1;
  // Trainer::step's collect_outputs (its default, and golden runs): world rank 0 assembles the token
  // losses of the global batch, and the distributed optimizer gathers the whole summed gradient.
  bool collect_outputs = true;
  // When the copies of pipeline sends are freed (comm_staging.h): the earliest possible moment gives the
  // prediction, the latest its upper bound.
  SendCompletion send_completion = SendCompletion::kAtNextSend;
  std::vector<HeldTensor> held;

  double params() const;
  // The group that reduces the gradients and shards the optimizer: dp x cp ranks (Megatron-LM's dp_cp
  // group, parallel/comm/grid.h), the dp group without context parallelism; this rank's place in it.
  int64_t dp_cp() const { return dp * cp; }
  int64_t dp_cp_rank() const { return cp_rank + cp * dp_rank; }
  // The optimizer's flat buffer (this rank's parameters padded to a multiple of dp x cp) and each dp_cp
  // rank's chunk of it (parallel/data/flat_buffer.h).
  double flat_size() const;
  double chunk() const { return flat_size() / static_cast<double>(dp_cp()); }
  // Zero stages 2 and 3 (parallel/data/dim0_shard.h): a tensor's dim-0 shard, ceil(rows / (dp x cp))
  // rows, and the all-gather's buffer of dp x cp shards that a gathered tensor keeps as its capacity.
  double shard(const HeldTensor& t) const {
    return std::ceil(t.rows / static_cast<double>(dp_cp())) * (t.numel / t.rows);
  }
  double gathered(const HeldTensor& t) const { return shard(t) * static_cast<double>(dp_cp()); }
  double shards() const;  // the sum of this rank's shards
  bool world_rank_zero() const { return tp_rank == 0 && cp_rank == 0 && dp_rank == 0 && stage == 0; }
};

// The rank at grid coordinates (tp_rank, cp_rank, dp_rank, stage) of a layout with `micro_batches` per
// replica and input.cp context-parallel ranks; its tensors come from a ShardPlan of the parameter table.
Fp64Rank fp64_rank(const MemoryPlanInput& input, int64_t dp, int64_t micro_batches, int64_t stage,
                   int64_t tp_rank, int64_t dp_rank, int64_t cp_rank = 0);

struct Fp64StepReplay {
  double stored_per_micro_batch = 0;  // bytes one micro-batch keeps in the stage's first chunk from its
                                      // forward to its backward
  int64_t in_flight = 0;              // most micro-batches (with virtual stages: chunk sets) stored at once
  double stored_at_peak = 0;          // the most bytes of those sets held at once
  PeakSnapshot peak;                  // largest live bytes beyond the model state, where, and of what
  std::vector<NamedBytes> stored_per_layer;  // one layer's stored tensors
  std::vector<NamedBytes> stored_head;       // stage output, and the head's on the last stage
};

// Replays a run's first two steps and returns the larger peak: the communication scratch grows during
// the first step and stays allocated, so from the second step on every step peaks at the same bytes. A
// run of one step (moments_dropped) replays that step alone, without an arena block after it.
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
