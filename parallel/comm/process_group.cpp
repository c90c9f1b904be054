// The part of ProcessGroup every implementation shares: byte counters, the record sink and the fault.
#include "parallel/comm/process_group.h"

#include <utility>

namespace touchstone {

int64_t TransferCounts::total_bytes() const {
  int64_t total = 0;
  for (const auto& [op, count] : by_op) total += count.bytes;
  return total;
}

int64_t TransferCounts::total_calls() const {
  int64_t total = 0;
  for (const auto& [op, count] : by_op) total += count.calls;
  return total;
}

void ProcessGroup::report(TransferRecord record) {
  if (record.site.empty()) record.site = site_;
  OpCount& count = counts_.by_op[record.op];
  count.calls += 1;
  count.bytes += record.bytes;
  if (sink_) sink_(std::move(record));
}

void ProcessGroup::report_transfer(const char* op, const Shape& shape, int64_t elements, int peer) {
  TransferRecord record;
  record.op = op;
  record.group = name();
  record.peer = peer;
  record.shape = shape;
  record.bytes = elements * static_cast<int64_t>(sizeof(double));
  report(std::move(record));
}

bool ProcessGroup::take_reduction_fault() {
  if (fault_ != FaultKind::kCorruptReduction) return false;
  fault_ = FaultKind::kNone;
  return rank() == 0;
}

void ProcessGroup::apply_reduction_fault(double* result, int64_t count) {
  if (take_reduction_fault() && count > 0) result[0] += 1.0;
}

void ProcessGroup::apply_reduction_fault(int64_t* result, int64_t count) {
  if (take_reduction_fault() && count > 0) result[0] += 1;
}

}  // namespace touchstone
