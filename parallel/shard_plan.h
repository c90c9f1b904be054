// Which parameters one rank holds, and in what shape: the pipeline stage decides which tensors
// (its layers; the embedding on the first stage; the final norm and output layer on the last; a tied
// embedding on both), tensor parallelism decides which shard of each (parallel/tensor/sharding.h).
// Data-parallel replicas hold the same shards. With virtual stages (interleaved 1F1B) a stage holds
// several model chunks: chunk c of stage s is virtual stage c x pp + s (Megatron-LM's assignment), so
// the first stage's chunk 0 has the embedding and the last stage's last chunk the head.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "model/param_table.h"
#include "model/transformer.h"

namespace touchstone {

class ShardPlan {
 public:
  ShardPlan(const ParamTable& table, const Config& config, int tp_rank, int tp_size, int stage);

  const ParamTable& table() const { return table_; }
  // The layers of each model chunk this stage holds, index = chunk ([virtual_stages]; one entry without
  // virtual stages). first_stage / last_stage mark the pipeline's first and last virtual stage.
  const std::vector<StageRange>& chunk_ranges() const { return chunks_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }

  bool holds(int id) const { return holds_[static_cast<size_t>(id)]; }
  const std::vector<int>& held_ids() const { return held_ids_; }
  std::vector<int64_t> local_shape(int id) const;
  int64_t local_numel(int id) const;

  // The pipeline stage whose copy is the parameter (a tied embedding belongs to the first stage; the
  // last stage's copy is kept equal to it).
  int owner_stage(int id) const;
  // True when this rank's shard is the one counted in the gradient norm and written to outputs:
  // held, on the owner stage, and for a replicated tensor only on tp rank 0.
  bool is_primary(int id) const;

  ParamTensors shard(const ParamTensors& full) const;  // tensors not held stay empty
  ParamTensors zeros() const;

 private:
  const ParamTable& table_;
  int tp_rank_, tp_size_, stage_;
  int num_stages_;
  std::vector<StageRange> chunks_;
  std::vector<int64_t> stage_boundaries_;  // of the virtual stages (Config::stage_boundaries)
  std::vector<bool> holds_;
  std::vector<int> held_ids_;
};

}  // namespace touchstone
