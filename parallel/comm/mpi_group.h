// The MPI implementation of ProcessGroup, private to parallel/: Grid::create makes one per group.
//
// Reductions never call MPI_Reduce or MPI_Allreduce on doubles: MPI may add contributions in any
// order (and Open MPI's choice depends on message size and process count), so two ranks, or two
// runs, could see different bits. Chunks are exchanged with MPI_Alltoall instead and summed
// locally in rank order 0..n-1 (see comm.h).
#pragma once

#include <mpi.h>

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace touchstone {

class MpiProcessGroup final : public ProcessGroup {
 public:
  // Owns `comm` (freed on destruction) unless it is MPI_COMM_NULL, which a group of one rank may
  // use: such a group never calls MPI. `global_ranks` is the world rank of each group rank.
  MpiProcessGroup(std::string name, MPI_Comm comm, std::vector<int> global_ranks, int rank,
                  std::function<void(TransferRecord)> sink);
  ~MpiProcessGroup() override;
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(global_ranks_.size()); }
  int global_rank(int group_rank) const override;

  void all_reduce_sum(double* data, int64_t count, const Shape& shape) override;
  void all_reduce_sum(int64_t* data, int64_t count) override;
  void all_reduce_max(double* data, int64_t count, const Shape& shape) override;
  void all_gather(const double* send, double* recv, int64_t count, const Shape& shape) override;
  void reduce_scatter_sum(const double* send, double* recv, int64_t count, const Shape& shape) override;
  void broadcast(double* data, int64_t count, int root, const Shape& shape) override;
  void all_to_all(const double* send, double* recv, int64_t count, const Shape& shape) override;
  void send(const double* data, int64_t count, int peer, int tag, const Shape& shape) override;
  void recv(double* data, int64_t count, int peer, int tag, const Shape& shape) override;
  void wait_sends() override;
  void barrier() override;

 private:
  struct PendingSend {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<double> data;  // MPI reads it until the request completes; moving keeps the buffer
  };

  // Deterministic reduce-scatter of send[size * count] into recv[count] (no record, no fault).
  void reduce_scatter_in_order(const double* send, double* recv, int64_t count);
  void check_peer(int peer, int tag) const;
  void release_completed_sends();
  void wait_pending_sends();

  std::string name_;
  MPI_Comm comm_;
  std::vector<int> global_ranks_;
  int rank_;
  MPI_Op max_op_ = MPI_OP_NULL;  // NaN- and signed-zero-aware max, so every rank gets the same bits
  int tag_upper_bound_ = 32767;  // the least MPI guarantees
  std::vector<PendingSend> pending_sends_;
  // Messages a group of one sends to itself, by tag, in send order (MPI's non-overtaking rule).
  std::map<int, std::deque<std::vector<double>>> self_messages_;
  std::vector<double> exchange_;  // reused across calls: gradient buffers are reduced every step
  std::vector<double> padded_;
};

}  // namespace touchstone
