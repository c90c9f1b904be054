// Replay of parallel/comm/mpi_group.cpp's scratch and send copies (see comm_staging.h).
#include "plan/comm_staging.h"

#include <algorithm>
#include <cmath>

namespace touchstone::plan {

void ReusedVector::reallocate(double capacity) {
  const int old = handle_;
  handle_ = tally_.alloc(capacity, name_, BufferKind::kStaging);
  if (old >= 0) tally_.release(old);
  capacity_ = capacity;
}

void ReusedVector::assign(double n) {
  if (n > capacity_) reallocate(n);
  size_ = n;
}

void ReusedVector::resize(double n) {
  if (n > capacity_) reallocate(size_ + std::max(size_, n - size_));
  size_ = n;
}

GroupScratch::GroupScratch(BufferTally& tally, const std::string& group, int64_t size)
    : size_(static_cast<double>(size)),
      padded_(tally, group + " all-reduce padded copy"),
      exchange_(tally, group + " reduce-scatter exchange") {}

void GroupScratch::all_reduce_sum(double count) {
  if (size_ == 1 || count <= 0) return;
  const double chunk = std::ceil(count / size_);
  padded_.assign(chunk * size_);
  reduce_scatter_sum(chunk);
}

void GroupScratch::reduce_scatter_sum(double count) {
  if (size_ == 1) return;
  exchange_.resize(count * size_);
}

void SendCopies::send(double count, const std::string& what) {
  // Before posting, the group frees the copies of the sends MPI_Test finds complete.
  while (completion_ == SendCompletion::kAtNextSend && !pending_.empty()) {
    tally_.release(pending_.front());
    pending_.pop_front();
  }
  pending_.push_back(tally_.alloc(count, group_ + " send copy: " + what, BufferKind::kStaging));
}

void SendCopies::wait_sends() {
  for (int handle : pending_) tally_.release(handle);
  pending_.clear();
}

}  // namespace touchstone::plan
