// MpiProcessGroup: every ProcessGroup call over one MPI communicator, with the deterministic
// reductions of comm.h. A group of one rank copies and records without calling MPI.
#include "parallel/comm/mpi_group.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <stdexcept>
#include <utility>

#include "parallel/comm/mpi_runtime.h"
#include "parallel/comm/ordered_max.h"

namespace touchstone {
namespace {

// MPI counts are int; a reference trainer's buffers fit, and a silent wrap would corrupt data.
int mpi_count(int64_t count) {
  if (count < 0 || count > std::numeric_limits<int>::max()) {
    throw std::length_error("MPI transfer of " + std::to_string(count) +
                            " elements does not fit an int count");
  }
  return static_cast<int>(count);
}

// The MPI operator of all_reduce_max (parallel/comm/ordered_max.h).
void ordered_max_op(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  const double* a = static_cast<const double*>(in);
  double* b = static_cast<double*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = ordered_max(a[i], b[i]);
}

}  // namespace

MpiProcessGroup::MpiProcessGroup(std::string name, MPI_Comm comm, std::vector<int> global_ranks, int rank,
                                 std::function<void(TransferRecord)> sink)
    : name_(std::move(name)), comm_(comm), global_ranks_(std::move(global_ranks)), rank_(rank) {
  set_record_sink(std::move(sink));
  if (comm_ != MPI_COMM_NULL) {
    // Errors become exceptions with the group's name in them instead of an anonymous abort.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Op_create(&ordered_max_op, 1, &max_op_);
    void* value = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found);
    if (found) tag_upper_bound_ = *static_cast<int*>(value);
  } else if (global_ranks_.size() != 1) {
    throw std::logic_error("process group " + name_ + " of several ranks has no communicator");
  }
}

MpiProcessGroup::~MpiProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding after a failure: a peer may never receive, so waiting could block forever. The
    // buffers are leaked on purpose, since MPI may still read them until the process exits.
    new std::vector<PendingSend>(std::move(pending_sends_));
    return;
  }
  wait_pending_sends();
  if (max_op_ != MPI_OP_NULL) MPI_Op_free(&max_op_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

int MpiProcessGroup::global_rank(int group_rank) const {
  if (group_rank < 0 || group_rank >= size()) {
    throw std::out_of_range("group " + name_ + " has no rank " + std::to_string(group_rank));
  }
  return global_ranks_[static_cast<size_t>(group_rank)];
}

void MpiProcessGroup::reduce_scatter_in_order(const double* send, double* recv, int64_t count) {
  const int n = size();
  if (n == 1) {
    if (recv != send) std::copy(send, send + count, recv);
    return;
  }
  const size_t chunk = static_cast<size_t>(count);
  exchange_.resize(chunk * static_cast<size_t>(n));
  // After the exchange, row r holds rank r's contribution to this rank's chunk. `send` is read in
  // full before `recv` is written, so recv may alias this rank's chunk of send.
  check_mpi(
      MPI_Alltoall(send, mpi_count(count), MPI_DOUBLE, exchange_.data(), mpi_count(count), MPI_DOUBLE, comm_),
      name_ + " reduce_scatter");
  std::copy(exchange_.begin(), exchange_.begin() + static_cast<std::ptrdiff_t>(chunk), recv);
  for (size_t r = 1; r < static_cast<size_t>(n); ++r) {
    const double* row = exchange_.data() + r * chunk;
    for (size_t i = 0; i < chunk; ++i) recv[i] += row[i];
  }
}

void MpiProcessGroup::all_reduce_sum(double* data, int64_t count, const Shape& shape) {
  const int n = size();
  if (n > 1 && count > 0) {
    // Pad to n equal chunks; rank r sums chunk r, then every rank gathers the same n sums.
    const int64_t chunk = (count + n - 1) / n;
    padded_.assign(static_cast<size_t>(chunk * n), 0.0);
    std::copy(data, data + count, padded_.begin());
    reduce_scatter_in_order(padded_.data(), padded_.data() + rank_ * chunk, chunk);
    check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, padded_.data(), mpi_count(chunk), MPI_DOUBLE,
                            comm_),
              name_ + " all_reduce");
    std::copy(padded_.begin(), padded_.begin() + count, data);
  }
  apply_reduction_fault(data, count);
  report_transfer("all_reduce", shape, count);
}

void MpiProcessGroup::all_reduce_sum(int64_t* data, int64_t count) {
  if (size() > 1 && count > 0) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_INT64_T, MPI_SUM, comm_),
              name_ + " all_reduce");
  }
  apply_reduction_fault(data, count);
  report_transfer("all_reduce", Shape{count}, count);
}

void MpiProcessGroup::all_reduce_max(double* data, int64_t count, const Shape& shape) {
  if (size() > 1 && count > 0) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_DOUBLE, max_op_, comm_),
              name_ + " all_reduce_max");
  }
  apply_reduction_fault(data, count);
  report_transfer("all_reduce_max", shape, count);
}

void MpiProcessGroup::all_gather(const double* send, double* recv, int64_t count, const Shape& shape) {
  const int n = size();
  double* own_chunk = recv + rank_ * count;
  if (n == 1) {
    if (send != own_chunk) std::copy(send, send + count, own_chunk);
  } else if (send == own_chunk) {
    check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, mpi_count(count), MPI_DOUBLE, comm_),
              name_ + " all_gather");
  } else {
    check_mpi(MPI_Allgather(send, mpi_count(count), MPI_DOUBLE, recv, mpi_count(count), MPI_DOUBLE, comm_),
              name_ + " all_gather");
  }
  report_transfer("all_gather", shape, count * n);
}

void MpiProcessGroup::reduce_scatter_sum(const double* send, double* recv, int64_t count,
                                         const Shape& shape) {
  reduce_scatter_in_order(send, recv, count);
  apply_reduction_fault(recv, count);
  report_transfer("reduce_scatter", shape, count * size());
}

void MpiProcessGroup::broadcast(double* data, int64_t count, int root, const Shape& shape) {
  if (root < 0 || root >= size()) {
    throw std::out_of_range("broadcast root " + std::to_string(root) + " is not a rank of group " + name_);
  }
  if (size() > 1) {
    check_mpi(MPI_Bcast(data, mpi_count(count), MPI_DOUBLE, root, comm_), name_ + " broadcast");
  }
  report_transfer("broadcast", shape, count);
}

void MpiProcessGroup::all_to_all(const double* send, double* recv, int64_t count, const Shape& shape) {
  const int n = size();
  if (n == 1) {
    if (send != recv) std::copy(send, send + count, recv);
  } else if (send == recv) {
    check_mpi(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, mpi_count(count), MPI_DOUBLE, comm_),
              name_ + " all_to_all");
  } else {
    check_mpi(MPI_Alltoall(send, mpi_count(count), MPI_DOUBLE, recv, mpi_count(count), MPI_DOUBLE, comm_),
              name_ + " all_to_all");
  }
  report_transfer("all_to_all", shape, count * n);
}

void MpiProcessGroup::check_peer(int peer, int tag) const {
  if (peer < 0 || peer >= size()) {
    throw std::out_of_range("peer " + std::to_string(peer) + " is not a rank of group " + name_);
  }
  if (tag < 0 || tag > tag_upper_bound_) {
    throw std::out_of_range("tag " + std::to_string(tag) + " outside [0, " +
                            std::to_string(tag_upper_bound_) + "]");
  }
}

void MpiProcessGroup::send(const double* data, int64_t count, int peer, int tag, const Shape& shape) {
  check_peer(peer, tag);
  std::vector<double> copy(data, data + count);
  if (size() == 1) {
    self_messages_[tag].push_back(std::move(copy));
  } else {
    release_completed_sends();
    PendingSend& pending = pending_sends_.emplace_back();
    pending.data = std::move(copy);
    check_mpi(
        MPI_Isend(pending.data.data(), mpi_count(count), MPI_DOUBLE, peer, tag, comm_, &pending.request),
        name_ + " send to rank " + std::to_string(global_rank(peer)));
  }
  report_transfer("send", shape, count, global_rank(peer));
}

void MpiProcessGroup::recv(double* data, int64_t count, int peer, int tag, const Shape& shape) {
  check_peer(peer, tag);
  const std::string what =
      name_ + " recv from rank " + std::to_string(global_rank(peer)) + " tag " + std::to_string(tag);
  if (size() == 1) {
    auto queue = self_messages_.find(tag);
    if (queue == self_messages_.end() || queue->second.empty()) {
      throw std::logic_error(what + ": nothing was sent, so it would wait forever");
    }
    std::vector<double> message = std::move(queue->second.front());
    queue->second.pop_front();
    if (static_cast<int64_t>(message.size()) != count) {
      throw std::runtime_error(what + ": got " + std::to_string(message.size()) + " elements, expected " +
                               std::to_string(count));
    }
    std::copy(message.begin(), message.end(), data);
  } else {
    MPI_Status status;
    check_mpi(MPI_Recv(data, mpi_count(count), MPI_DOUBLE, peer, tag, comm_, &status), what);
    int received = 0;
    MPI_Get_count(&status, MPI_DOUBLE, &received);
    if (received != count) {
      throw std::runtime_error(what + ": got " + std::to_string(received) + " elements, expected " +
                               std::to_string(count));
    }
  }
  report_transfer("recv", shape, count, global_rank(peer));
}

void MpiProcessGroup::release_completed_sends() {
  // Keeps a long schedule that rarely calls wait_sends from holding every copy it ever sent.
  std::erase_if(pending_sends_, [](PendingSend& pending) {
    int done = 0;
    MPI_Test(&pending.request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
}

void MpiProcessGroup::wait_pending_sends() {
  for (PendingSend& pending : pending_sends_) MPI_Wait(&pending.request, MPI_STATUS_IGNORE);
  pending_sends_.clear();
}

void MpiProcessGroup::wait_sends() {
  std::vector<MPI_Request> requests;
  requests.reserve(pending_sends_.size());
  for (const PendingSend& pending : pending_sends_) requests.push_back(pending.request);
  const int code = MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  pending_sends_.clear();
  check_mpi(code, name_ + " wait_sends");
}

void MpiProcessGroup::barrier() {
  if (size() > 1) check_mpi(MPI_Barrier(comm_), name_ + " barrier");
  report_transfer("barrier", Shape{}, 0);
}

}  // namespace touchstone
