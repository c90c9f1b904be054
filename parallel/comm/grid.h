// The process grid: world = tp x cp x dp x pp ranks, and the process groups of each parallelism.
//
// Rank order (Megatron-LM's, without expert parallelism): tp fastest, then cp, then dp, then pp:
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
// so the ranks of one tensor-parallel group are neighbours (on one node in a real cluster), and those
// of one context-parallel group next closest.
//
// Groups, each made with MPI_Comm_split of MPI_COMM_WORLD:
//   tp         same (cp_rank, dp_rank, pp_rank): shards each layer's weights
//   cp         same (tp_rank, dp_rank, pp_rank): each holds two chunks of every window's positions
//   dp         same (tp_rank, cp_rank, pp_rank): replicas that read different micro-batches
//   dp_cp      same (tp_rank, pp_rank): every rank whose gradients are partial sums of the same
//              tensors (Megatron-LM's data-parallel group with context parallelism); the dp group
//              when cp == 1
//   pp         same (tp_rank, cp_rank, dp_rank): the stages one micro-batch flows through
//   embedding  the first and last pipeline stage of a pp group (tied embeddings sum their gradient
//              there); a group of one rank on the other stages, and when pp == 1
// Each group is an MpiProcessGroup, or with CommBackend::kNccl an NcclProcessGroup (which keeps the
// group's MPI communicator for its bootstrap and point-to-point transfers).
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "parallel/comm/comm_backend.h"
#include "parallel/comm/process_group.h"

namespace touchstone {

struct GridLayout {
  int tp = 1, dp = 1, pp = 1, cp = 1;
  int world_size() const { return tp * cp * dp * pp; }
};

struct GridCoordinates {
  int tp_rank = 0, dp_rank = 0, pp_rank = 0, cp_rank = 0;
};

// The grid of a run's config (validated: its world size fits).
GridLayout grid_layout(const ParallelConfig& parallel);
int rank_of(const GridLayout& layout, const GridCoordinates& coordinates);
GridCoordinates coordinates_of(const GridLayout& layout, int rank);

class Grid {
 public:
  // Collective over MPI_COMM_WORLD; MPI must be initialised and the world size must equal
  // layout.world_size() (checked by the caller's config validation; a mismatch here throws
  // std::invalid_argument). The grid must be destroyed before the MpiRuntime. With kNccl every rank
  // needs a GPU of its own (docs/communication.md#nccl); the InputError of check_comm_available is
  // thrown when NCCL cannot run here, and another when two ranks of a group would share a GPU.
  static std::unique_ptr<Grid> create(const GridLayout& layout, CommBackend comm = CommBackend::kMpi);
  virtual ~Grid() = default;

  const GridLayout& layout() const { return layout_; }
  const GridCoordinates& coordinates() const { return coordinates_; }
  int global_rank() const { return rank_; }
  bool is_first_stage() const { return coordinates_.pp_rank == 0; }
  bool is_last_stage() const { return coordinates_.pp_rank == layout_.pp - 1; }

  virtual ProcessGroup& world() = 0;
  virtual ProcessGroup& tp() = 0;
  virtual ProcessGroup& cp() = 0;
  virtual ProcessGroup& dp() = 0;
  virtual ProcessGroup& dp_cp() = 0;
  virtual ProcessGroup& pp() = 0;
  virtual ProcessGroup& embedding() = 0;
  // The group called `name` ("world", "tp", "cp", "dp", "dp_cp", "pp", "embedding");
  // std::invalid_argument otherwise.
  ProcessGroup& group(const std::string& name);

  // What trace records say about the program (step, micro-batch, phase); set by the trainer.
  TraceContext& context() { return context_; }
  // Called for every transfer of every group of this process, after it completes.
  void set_observer(TransferObserver observer) { observer_ = std::move(observer); }

 protected:
  Grid(const GridLayout& layout, int rank)
      : layout_(layout), coordinates_(coordinates_of(layout, rank)), rank_(rank) {}
  // Implementations make this every group's record sink (ProcessGroup::set_record_sink), so the
  // observer and the trace context stay owned by the grid.
  void record(TransferRecord record) const {
    if (observer_) {
      record.context = context_;
      observer_(record);
    }
  }

 private:
  GridLayout layout_;
  GridCoordinates coordinates_;
  int rank_;
  TraceContext context_;
  TransferObserver observer_;
};

}  // namespace touchstone
