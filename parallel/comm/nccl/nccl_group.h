// The NCCL implementation of ProcessGroup (CUDA builds only; docs/communication.md#nccl): the same
// results, bits, records and faults as MpiProcessGroup, with the collectives on the GPU.
//
// The interface takes host pointers (the model's buffers live on the host), so each collective
// uploads its input into the group's device buffers (grow-only, reused), runs NCCL and, for
// reductions, a rank-order kernel on the group's stream, downloads the result and waits for it.
// No double is reduced by NCCL, whose ring and tree orders differ between ranks and algorithms:
//   reduce_scatter_sum   all-to-all of chunks (ncclSend/ncclRecv with every peer in one group call),
//                        then a kernel adding the n contributions in rank order 0..n-1
//   all_reduce_sum       padded to n equal chunks, that reduce-scatter, then ncclAllGather
//   all_reduce_max       ncclAllGather, then a kernel folding ordered_max in rank order
//   all_reduce_sum(int)  ncclAllReduce on int64 (exact)
//
// Point to point (send, recv, wait_sends) and barrier go over the group's MPI communicator through an
// MpiProcessGroup of the same members: an NCCL send completes only once the peer posts its receive and
// NCCL has no tags, but the pipeline executor needs sends that never wait and receives matched by tag
// (parallel/pipeline/schedule.h). A group without an NCCL communicator (a group of one rank in a grid)
// runs every call through that MPI group, which copies locally.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "kernels/cuda/device.cuh"
#include "parallel/comm/mpi_grid.h"
#include "parallel/comm/mpi_group.h"
#include "parallel/comm/nccl/bootstrap.h"
#include "parallel/comm/process_group.h"

namespace touchstone {

static_assert(kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);

// A fresh id from ncclGetUniqueId; std::runtime_error naming the NCCL error otherwise.
NcclUniqueIdBytes nccl_unique_id();

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Collective over members.comm. When it is not MPI_COMM_NULL (even with one rank, as the GPU test
  // uses it), checks that no two ranks of the group share a GPU (InputError) and starts an NCCL
  // communicator of the same ranks on GPU `device`, from the id that group rank 0's `generate` made.
  NcclProcessGroup(GroupMembers members, int device, const UniqueIdGenerator& generate = nccl_unique_id);
  ~NcclProcessGroup() override;
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  const std::string& name() const override { return host_->name(); }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int global_rank(int group_rank) const override { return host_->global_rank(group_rank); }
  bool uses_nccl() const { return nccl_ != nullptr; }

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
  // host_, for a reduction it runs instead of NCCL: this group's pending fault moves to it, so the
  // fault fires exactly where the MPI group's would.
  MpiProcessGroup& host_reduction();
  void use_device(const char* op) const;
  void check_nccl(ncclResult_t result, const char* op) const;
  // Device buffers hold `elements` 8-byte elements (doubles or int64); copies are on the stream.
  template <typename T>
  T* reserve(cuda::DeviceBytes& buffer, int64_t elements) {
    return static_cast<T*>(buffer.reserve(static_cast<size_t>(elements) * sizeof(double)));
  }
  void to_device(void* device, const void* host, int64_t elements, const char* op);
  void to_host(void* host, const void* device, int64_t elements, const char* op);
  void finish(const char* op);  // waits for the stream: downloads are in host memory after it
  // send[n * count] -> recv[n * count] on the device: chunk r of send to rank r, row r of recv from it.
  void exchange_chunks(const double* send, double* recv, int64_t count, const char* op);
  // Deterministic reduce-scatter on the device (no record, no fault); recv may be send's own chunk.
  void reduce_scatter_in_order(const double* send, double* recv, int64_t count, const char* op);

  std::unique_ptr<MpiProcessGroup> host_;  // the same members over MPI (owns the MPI communicator)
  int device_;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceBytes input_, exchange_, output_;  // reused across calls: gradients are reduced every step
};

}  // namespace touchstone
