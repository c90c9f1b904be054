// The operations commbench measures: inputs whose results are exact in any reduction order, the call
// through the ProcessGroup interface, and the element-by-element check.
#include "tools/commbench/commbench_ops.h"

#include <algorithm>

namespace touchstone::commbench {
namespace {

// Small integers: sums of n of them are exact in doubles whatever the order of the additions.
double value(int64_t source, int64_t i) { return static_cast<double>((source + 1) * (i % 7 + 1)); }
// Never a correct result (every expected value is positive), so an element left unwritten counts.
constexpr double kSentinel = -1.0;

}  // namespace

const std::vector<OpInfo>& all_ops() {
  // all_reduce and broadcast exist only in place in the interface (the trainer reduces and
  // broadcasts its buffers in place), so they have no out-of-place column.
  static const std::vector<OpInfo> ops = {
      {Op::kAllReduce, "all_reduce", "sum", false, true, true, false},
      {Op::kAllGather, "all_gather", "none", true, true, false, true},
      {Op::kReduceScatter, "reduce_scatter", "sum", true, true, true, true},
      {Op::kBroadcast, "broadcast", "none", false, true, false, false},
      {Op::kAllToAll, "all_to_all", "none", true, true, false, true},
      {Op::kSendRecv, "sendrecv", "none", true, true, false, false},
  };
  return ops;
}

const OpInfo* find_op(const std::string& name) {
  for (const OpInfo& info : all_ops()) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

double bus_factor(Op op, int n) {
  const double ranks = static_cast<double>(n);
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (ranks - 1.0) / ranks;
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll:
      return (ranks - 1.0) / ranks;
    case Op::kBroadcast:
    case Op::kSendRecv:
      return 1.0;
  }
  return 1.0;
}

int64_t count_for_bytes(const OpInfo& info, int64_t bytes, int n) {
  const int64_t elements = bytes / static_cast<int64_t>(sizeof(double));
  return info.chunked ? elements / n : elements;
}

int64_t bytes_for_count(const OpInfo& info, int64_t count, int n) {
  return (info.chunked ? count * n : count) * static_cast<int64_t>(sizeof(double));
}

OpRunner::OpRunner(const OpInfo& info, ProcessGroup& group, int64_t count, int root, bool in_place)
    : info_(info),
      group_(group),
      count_(count),
      root_(root),
      in_place_(in_place),
      rank_(group.rank()),
      n_(group.size()) {
  const size_t per_rank = static_cast<size_t>(count);
  const size_t total = info.chunked ? per_rank * static_cast<size_t>(n_) : per_rank;
  switch (info.op) {
    case Op::kAllReduce:
    case Op::kBroadcast:
      recv_.resize(per_rank);
      break;
    case Op::kAllGather:
      if (!in_place) send_.resize(per_rank);
      recv_.resize(total);
      break;
    case Op::kReduceScatter:
      send_.resize(total);  // in place, the result is this rank's chunk of send_
      if (!in_place) recv_.resize(per_rank);
      break;
    case Op::kAllToAll:
      if (!in_place) send_.resize(total);
      recv_.resize(total);
      break;
    case Op::kSendRecv:
      if (!in_place) send_.resize(per_rank);
      recv_.resize(per_rank);
      break;
  }
}

void OpRunner::init() {
  std::fill(recv_.begin(), recv_.end(), kSentinel);
  const int64_t n = n_;
  switch (info_.op) {
    case Op::kAllReduce:
      for (int64_t i = 0; i < count_; ++i) recv_[i] = value(rank_, i);
      break;
    case Op::kBroadcast:
      if (rank_ == root_) {
        for (int64_t i = 0; i < count_; ++i) recv_[i] = value(root_, i);
      }
      break;
    case Op::kAllGather: {
      double* own = in_place_ ? recv_.data() + rank_ * count_ : send_.data();
      for (int64_t i = 0; i < count_; ++i) own[i] = value(rank_, i);
      break;
    }
    case Op::kReduceScatter:
      for (int64_t j = 0; j < n * count_; ++j) send_[j] = value(rank_, j);
      break;
    case Op::kAllToAll: {
      // Chunk q goes to rank q: its values name both the source and the destination.
      std::vector<double>& input = in_place_ ? recv_ : send_;
      for (int64_t q = 0; q < n; ++q) {
        for (int64_t i = 0; i < count_; ++i) input[q * count_ + i] = value(rank_ * n + q, i);
      }
      break;
    }
    case Op::kSendRecv: {
      std::vector<double>& input = in_place_ ? recv_ : send_;
      for (int64_t i = 0; i < count_; ++i) input[i] = value(rank_, i);
      break;
    }
  }
}

const double* OpRunner::result() const {
  if (info_.op == Op::kReduceScatter && in_place_) return send_.data() + rank_ * count_;
  return recv_.data();
}

void OpRunner::run() {
  const Shape shape{count_};
  switch (info_.op) {
    case Op::kAllReduce:
      group_.all_reduce_sum(recv_.data(), count_, shape);
      break;
    case Op::kBroadcast:
      group_.broadcast(recv_.data(), count_, root_, shape);
      break;
    case Op::kAllGather:
      group_.all_gather(in_place_ ? recv_.data() + rank_ * count_ : send_.data(), recv_.data(), count_,
                        shape);
      break;
    case Op::kReduceScatter:
      group_.reduce_scatter_sum(send_.data(), in_place_ ? send_.data() + rank_ * count_ : recv_.data(),
                                count_, shape);
      break;
    case Op::kAllToAll:
      group_.all_to_all(in_place_ ? recv_.data() : send_.data(), recv_.data(), count_, shape);
      break;
    case Op::kSendRecv: {
      // A ring: every rank sends to the next and receives from the previous one. send copies the
      // data, so in place the same buffer is sent and then overwritten by the receive.
      const double* input = in_place_ ? recv_.data() : send_.data();
      group_.send(input, count_, (rank_ + 1) % n_, 0, shape);
      group_.recv(recv_.data(), count_, (rank_ + n_ - 1) % n_, 0, shape);
      group_.wait_sends();
      break;
    }
  }
}

int64_t OpRunner::count_wrong() const {
  const int64_t n = n_;
  const double ranks_sum = static_cast<double>(n * (n + 1) / 2);  // sum of (rank + 1)
  const double* out = result();
  int64_t wrong = 0;
  auto expect = [&wrong](double got, double want) { wrong += got != want ? 1 : 0; };
  switch (info_.op) {
    case Op::kAllReduce:
      for (int64_t i = 0; i < count_; ++i) expect(out[i], ranks_sum * static_cast<double>(i % 7 + 1));
      break;
    case Op::kBroadcast:
      for (int64_t i = 0; i < count_; ++i) expect(out[i], value(root_, i));
      break;
    case Op::kAllGather:
      for (int64_t q = 0; q < n; ++q) {
        for (int64_t i = 0; i < count_; ++i) expect(out[q * count_ + i], value(q, i));
      }
      break;
    case Op::kReduceScatter:
      for (int64_t i = 0; i < count_; ++i) {
        expect(out[i], ranks_sum * static_cast<double>((rank_ * count_ + i) % 7 + 1));
      }
      break;
    case Op::kAllToAll:
      for (int64_t q = 0; q < n; ++q) {
        for (int64_t i = 0; i < count_; ++i) expect(out[q * count_ + i], value(q * n + rank_, i));
      }
      break;
    case Op::kSendRecv:
      for (int64_t i = 0; i < count_; ++i) expect(out[i], value((rank_ + n - 1) % n, i));
      break;
  }
  return wrong;
}

}  // namespace touchstone::commbench
