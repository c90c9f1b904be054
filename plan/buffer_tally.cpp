// Live bytes by kind, and the snapshot of the largest total (see buffer_tally.h).
#include "plan/buffer_tally.h"

#include <algorithm>

namespace touchstone::plan {

namespace {
constexpr double kBytes = 8.0;  // FP64
}  // namespace

double& BufferTally::live_of(BufferKind kind) {
  switch (kind) {
    case BufferKind::kStored:
      return stored_;
    case BufferKind::kStaging:
      return staging_;
    case BufferKind::kWorking:
      break;
  }
  return working_;
}

int BufferTally::alloc(double elements, const std::string& what, BufferKind kind) {
  const double bytes = elements * kBytes;
  const int handle = static_cast<int>(buffers_.size());
  buffers_.push_back({bytes, kind, kind == BufferKind::kStaging ? what : std::string()});
  if (kind == BufferKind::kStaging) live_staging_.push_back(handle);
  live_ += bytes;
  live_of(kind) += bytes;
  if (live_ > peak_.at.bytes) take_snapshot(what);
  return handle;
}

void BufferTally::release(int handle) {
  Buffer& buffer = buffers_[static_cast<size_t>(handle)];
  live_ -= buffer.bytes;
  live_of(buffer.kind) -= buffer.bytes;
  buffer.bytes = 0;
  if (buffer.kind == BufferKind::kStaging) std::erase(live_staging_, handle);
}

void BufferTally::store(int handle) {
  Buffer& buffer = buffers_[static_cast<size_t>(handle)];
  live_of(buffer.kind) -= buffer.bytes;
  buffer.kind = BufferKind::kStored;
  stored_ += buffer.bytes;
}

void BufferTally::release(const std::vector<int>& handles) {
  for (int h : handles) release(h);
}

void BufferTally::reset_peak() { take_snapshot("live at the start"); }

void BufferTally::take_snapshot(const std::string& what) {
  peak_.at = {context_ + where_ + ": " + what, live_};
  peak_.stored = stored_;
  peak_.working = working_;
  peak_.staging = staging_;
  peak_.stored_micro_batches = stored_micro_batches_;
  peak_.staging_buffers.clear();
  for (int h : live_staging_) {
    const Buffer& buffer = buffers_[static_cast<size_t>(h)];
    peak_.staging_buffers.push_back({buffer.name, buffer.bytes});
  }
}

}  // namespace touchstone::plan
