// NcclProcessGroup: the collectives over NCCL with the MPI group's bits, point to point over MPI
// (parallel/comm/nccl/nccl_group.h), and the --comm nccl group maker (parallel/comm/nccl/nccl_grid.h).
#include "parallel/comm/nccl/nccl_group.h"

#include <cstring>
#include <exception>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_device.h"
#include "parallel/comm/mpi_runtime.h"
#include "parallel/comm/nccl/nccl_grid.h"
#include "parallel/comm/nccl/rank_order.h"

namespace touchstone {
namespace {

constexpr int64_t kElementBytes = static_cast<int64_t>(sizeof(double));  // int64 elements too

// This rank's GPU, unique across the job, for the one-GPU-per-rank check: "<PCI bus id> on <host>".
std::string gpu_identity(int device) {
  char bus_id[32] = {};
  cuda::check(cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof(bus_id)), device),
              "cudaDeviceGetPCIBusId");
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  return std::string(bus_id) + " on " + std::string(host, static_cast<size_t>(length));
}

}  // namespace

NcclUniqueIdBytes nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    throw std::runtime_error(std::string("NCCL ncclGetUniqueId: ") + ncclGetErrorString(result));
  }
  NcclUniqueIdBytes bytes;
  std::memcpy(bytes.data(), id.internal, bytes.size());
  return bytes;
}

NcclProcessGroup::NcclProcessGroup(GroupMembers members, int device, const UniqueIdGenerator& generate)
    : device_(device) {
  set_record_sink(std::move(members.sink));
  const MPI_Comm comm = members.comm;
  const std::vector<int> global_ranks = members.global_ranks;
  // The MPI twin reports through this group, so its transfers count and trace as this group's.
  host_ = std::make_unique<MpiProcessGroup>(std::move(members.name), comm, std::move(members.global_ranks),
                                            members.rank,
                                            [this](TransferRecord record) { report(std::move(record)); });
  if (comm == MPI_COMM_NULL) return;
  use_device("start");
  check_one_gpu_per_rank(comm, name(), global_ranks, gpu_identity(device_));
  const NcclBootstrap bootstrap = share_unique_id(comm, name(), generate);
  ncclUniqueId id;
  std::memcpy(id.internal, bootstrap.unique_id.data(), sizeof(id.internal));
  check_nccl(ncclCommInitRank(&nccl_, bootstrap.ranks, id, bootstrap.rank), "ncclCommInitRank");
  cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
              ("group " + name() + " cudaStreamCreate").c_str());
}

NcclProcessGroup::~NcclProcessGroup() {
  if (nccl_ == nullptr) return;
  cudaSetDevice(device_);  // nothing to report from a destructor
  // Unwinding after a failure: a peer may never reach the teardown, so this rank aborts its side
  // alone instead of waiting for it.
  if (std::uncaught_exceptions() > 0) {
    ncclCommAbort(nccl_);
  } else {
    ncclCommDestroy(nccl_);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

MpiProcessGroup& NcclProcessGroup::host_reduction() {
  host_->set_fault(fault());
  set_fault(FaultKind::kNone);
  return *host_;
}

void NcclProcessGroup::use_device(const char* op) const {
  cuda::check(cudaSetDevice(device_), ("group " + name() + " " + op + ": cudaSetDevice").c_str());
}

void NcclProcessGroup::check_nccl(ncclResult_t result, const char* op) const {
  if (result == ncclSuccess) return;
  std::string message = "NCCL group " + name() + " " + op + ": " + ncclGetErrorString(result);
  const char* detail = ncclGetLastError(nccl_);
  if (detail != nullptr && detail[0] != '\0') message += std::string(" (") + detail + ")";
  throw std::runtime_error(message);
}

void NcclProcessGroup::to_device(void* device, const void* host, int64_t elements, const char* op) {
  if (elements == 0) return;
  cuda::check(cudaMemcpyAsync(device, host, static_cast<size_t>(elements * kElementBytes),
                              cudaMemcpyHostToDevice, stream_),
              ("group " + name() + " " + op + ": copy to device").c_str());
}

void NcclProcessGroup::to_host(void* host, const void* device, int64_t elements, const char* op) {
  if (elements == 0) return;
  cuda::check(cudaMemcpyAsync(host, device, static_cast<size_t>(elements * kElementBytes),
                              cudaMemcpyDeviceToHost, stream_),
              ("group " + name() + " " + op + ": copy to host").c_str());
}

void NcclProcessGroup::finish(const char* op) {
  cuda::check(cudaStreamSynchronize(stream_),
              ("group " + name() + " " + op + ": stream synchronize").c_str());
}

void NcclProcessGroup::exchange_chunks(const double* send, double* recv, int64_t count, const char* op) {
  const auto chunk = static_cast<size_t>(count);
  // One group call: every send and receive is posted before any waits, so no pair of ranks blocks.
  // The group is always closed, even after a failed post, so NCCL's state stays consistent.
  ncclResult_t result = ncclGroupStart();
  for (int peer = 0; peer < size() && result == ncclSuccess; ++peer) {
    const size_t offset = static_cast<size_t>(peer) * chunk;
    result = ncclSend(send + offset, chunk, ncclDouble, peer, nccl_, stream_);
    if (result == ncclSuccess) result = ncclRecv(recv + offset, chunk, ncclDouble, peer, nccl_, stream_);
  }
  const ncclResult_t end = ncclGroupEnd();
  check_nccl(result != ncclSuccess ? result : end, op);
}

void NcclProcessGroup::reduce_scatter_in_order(const double* send, double* recv, int64_t count,
                                               const char* op) {
  const int n = size();
  auto* rows = reserve<double>(exchange_, count * n);
  // After the exchange, row r holds rank r's contribution to this rank's chunk. The kernel runs after
  // the exchange on the same stream, so recv may be this rank's chunk of send.
  exchange_chunks(send, rows, count, op);
  nccl::sum_in_rank_order(rows, n, count, recv, stream_);
}

void NcclProcessGroup::all_reduce_sum(double* data, int64_t count, const Shape& shape) {
  if (nccl_ == nullptr) return host_reduction().all_reduce_sum(data, count, shape);
  if (count > 0) {
    use_device("all_reduce");
    // Pad to n equal chunks; rank r sums chunk r, then every rank gathers the same n sums.
    const int n = size();
    const int64_t chunk = (count + n - 1) / n;
    auto* padded = reserve<double>(input_, chunk * n);
    to_device(padded, data, count, "all_reduce");
    cuda::check(
        cudaMemsetAsync(padded + count, 0, static_cast<size_t>((chunk * n - count) * kElementBytes), stream_),
        ("group " + name() + " all_reduce: padding").c_str());
    double* own_chunk = padded + rank() * chunk;
    reduce_scatter_in_order(padded, own_chunk, chunk, "all_reduce");
    check_nccl(ncclAllGather(own_chunk, padded, static_cast<size_t>(chunk), ncclDouble, nccl_, stream_),
               "all_reduce");
    to_host(data, padded, count, "all_reduce");
    finish("all_reduce");
  }
  apply_reduction_fault(data, count);
  report_transfer("all_reduce", shape, count);
}

void NcclProcessGroup::all_reduce_sum(int64_t* data, int64_t count) {
  if (nccl_ == nullptr) return host_reduction().all_reduce_sum(data, count);
  if (count > 0) {
    use_device("all_reduce");
    // Integer sums are exact in any order, so NCCL's own reduction is safe here.
    auto* values = reserve<int64_t>(input_, count);
    to_device(values, data, count, "all_reduce");
    check_nccl(ncclAllReduce(values, values, static_cast<size_t>(count), ncclInt64, ncclSum, nccl_, stream_),
               "all_reduce");
    to_host(data, values, count, "all_reduce");
    finish("all_reduce");
  }
  apply_reduction_fault(data, count);
  report_transfer("all_reduce", Shape{count}, count);
}

void NcclProcessGroup::all_reduce_max(double* data, int64_t count, const Shape& shape) {
  if (nccl_ == nullptr) return host_reduction().all_reduce_max(data, count, shape);
  if (count > 0) {
    use_device("all_reduce_max");
    const int n = size();
    auto* rows = reserve<double>(exchange_, count * n);
    double* own_row = rows + rank() * count;
    to_device(own_row, data, count, "all_reduce_max");
    check_nccl(ncclAllGather(own_row, rows, static_cast<size_t>(count), ncclDouble, nccl_, stream_),
               "all_reduce_max");
    auto* result = reserve<double>(output_, count);
    nccl::max_in_rank_order(rows, n, count, result, stream_);
    to_host(data, result, count, "all_reduce_max");
    finish("all_reduce_max");
  }
  apply_reduction_fault(data, count);
  report_transfer("all_reduce_max", shape, count);
}

void NcclProcessGroup::all_gather(const double* send, double* recv, int64_t count, const Shape& shape) {
  if (nccl_ == nullptr) return host_->all_gather(send, recv, count, shape);
  const int n = size();
  if (count > 0) {
    use_device("all_gather");
    // In place on the device. The upload reads `send` before the download writes `recv` (one
    // stream), so the host buffers may overlap as the interface allows.
    auto* gathered = reserve<double>(output_, count * n);
    double* own_chunk = gathered + rank() * count;
    to_device(own_chunk, send, count, "all_gather");
    check_nccl(ncclAllGather(own_chunk, gathered, static_cast<size_t>(count), ncclDouble, nccl_, stream_),
               "all_gather");
    to_host(recv, gathered, count * n, "all_gather");
    finish("all_gather");
  }
  report_transfer("all_gather", shape, count * n);
}

void NcclProcessGroup::reduce_scatter_sum(const double* send, double* recv, int64_t count,
                                          const Shape& shape) {
  if (nccl_ == nullptr) return host_reduction().reduce_scatter_sum(send, recv, count, shape);
  const int n = size();
  if (count > 0) {
    use_device("reduce_scatter");
    auto* input = reserve<double>(input_, count * n);
    auto* result = reserve<double>(output_, count);
    to_device(input, send, count * n, "reduce_scatter");
    reduce_scatter_in_order(input, result, count, "reduce_scatter");
    to_host(recv, result, count, "reduce_scatter");
    finish("reduce_scatter");
  }
  apply_reduction_fault(recv, count);
  report_transfer("reduce_scatter", shape, count * n);
}

void NcclProcessGroup::broadcast(double* data, int64_t count, int root, const Shape& shape) {
  if (nccl_ == nullptr) return host_->broadcast(data, count, root, shape);
  if (root < 0 || root >= size()) {
    throw std::out_of_range("broadcast root " + std::to_string(root) + " is not a rank of group " + name());
  }
  if (count > 0) {
    use_device("broadcast");
    auto* buffer = reserve<double>(input_, count);
    // Only the root's data matters: the other ranks' is overwritten, so only the root uploads.
    if (rank() == root) to_device(buffer, data, count, "broadcast");
    check_nccl(ncclBroadcast(buffer, buffer, static_cast<size_t>(count), ncclDouble, root, nccl_, stream_),
               "broadcast");
    if (rank() != root) to_host(data, buffer, count, "broadcast");
    finish("broadcast");
  }
  report_transfer("broadcast", shape, count);
}

void NcclProcessGroup::all_to_all(const double* send, double* recv, int64_t count, const Shape& shape) {
  if (nccl_ == nullptr) return host_->all_to_all(send, recv, count, shape);
  const int n = size();
  if (count > 0) {
    use_device("all_to_all");
    auto* input = reserve<double>(input_, count * n);
    auto* result = reserve<double>(output_, count * n);
    to_device(input, send, count * n, "all_to_all");
    exchange_chunks(input, result, count, "all_to_all");
    to_host(recv, result, count * n, "all_to_all");
    finish("all_to_all");
  }
  report_transfer("all_to_all", shape, count * n);
}

// Point to point and the barrier stay on MPI (see the header); the MPI twin records them as this
// group's transfers. Every earlier collective has finished on the device when its call returned, so
// MPI's order is the program's order.
void NcclProcessGroup::send(const double* data, int64_t count, int peer, int tag, const Shape& shape) {
  host_->send(data, count, peer, tag, shape);
}

void NcclProcessGroup::recv(double* data, int64_t count, int peer, int tag, const Shape& shape) {
  host_->recv(data, count, peer, tag, shape);
}

void NcclProcessGroup::wait_sends() { host_->wait_sends(); }

void NcclProcessGroup::barrier() { host_->barrier(); }

GroupMaker nccl_group_maker() {
  const int device = cuda::device_for_local_rank(node_local_rank(), cuda_device_count());
  cuda::check(cudaSetDevice(device), "cudaSetDevice");
  return [device](GroupMembers members) -> std::unique_ptr<ProcessGroup> {
    return std::make_unique<NcclProcessGroup>(std::move(members), device);
  };
}

}  // namespace touchstone
