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
    case BufferKind::kArena:
      return arena_;
    case BufferKind::kWorking:
      break;
  }
  return working_;
}

int BufferTally::alloc(double elements, const std::string& what, BufferKind kind) {
  if (!in_arena_step_ || kind == BufferKind::kStaging || kind == BufferKind::kArena)
    return add(elements * kBytes, what, kind, -1);
  const auto data_bytes = static_cast<int64_t>(elements * kBytes);
  const int64_t bytes = ActivationArena::block_bytes(data_bytes);
  const auto lifetime = static_cast<int64_t>(arena_record_.size());
  arena_record_.push_back({bytes, arena_events_++, ArenaLifetime::kNever});
  if (!arena_planned_) return add(static_cast<double>(bytes), what, kind, lifetime);
  // Placed in the block: the block's free part shrinks by what the buffer's kind grows, the total stays.
  const int handle = static_cast<int>(buffers_.size());
  buffers_.push_back({static_cast<double>(bytes), kind, std::string(), lifetime, true});
  arena_ -= static_cast<double>(bytes);
  live_of(kind) += static_cast<double>(bytes);
  // At the same total, the snapshot follows the most of the block in use: the activation peak.
  if (live_ >= peak_.at.bytes && stored_ + working_ > peak_.stored + peak_.working) take_snapshot(what);
  return handle;
}

int BufferTally::alloc_outside_arena(double elements, const std::string& what) {
  return add(elements * kBytes, what, BufferKind::kWorking, -1);
}

int BufferTally::add(double bytes, const std::string& what, BufferKind kind, int64_t lifetime) {
  const int handle = static_cast<int>(buffers_.size());
  buffers_.push_back({bytes, kind, kind == BufferKind::kStaging ? what : std::string(), lifetime, false});
  if (kind == BufferKind::kStaging) live_staging_.push_back(handle);
  live_ += bytes;
  live_of(kind) += bytes;
  if (live_ > peak_.at.bytes ||
      (live_ == peak_.at.bytes && stored_ + working_ > peak_.stored + peak_.working))
    take_snapshot(what);  // at an equal total, the moment with more of it in buffers (see alloc)
  return handle;
}

void BufferTally::begin_arena_step() {
  in_arena_step_ = true;
  arena_record_.clear();
  arena_events_ = 0;
}

void BufferTally::end_arena_step(bool make_layout) {
  in_arena_step_ = false;
  if (!make_layout || arena_planned_ || arena_record_.empty()) return;
  arena_planned_ = true;
  add(static_cast<double>(plan_arena_layout(arena_record_).bytes), "activation arena", BufferKind::kArena,
      -1);
}

void BufferTally::release(int handle) {
  Buffer& buffer = buffers_[static_cast<size_t>(handle)];
  if (buffer.lifetime >= 0 && in_arena_step_) {
    ArenaLifetime& lifetime = arena_record_[static_cast<size_t>(buffer.lifetime)];
    if (lifetime.released == ArenaLifetime::kNever) lifetime.released = arena_events_++;
  }
  live_ -= buffer.bytes;
  live_of(buffer.kind) -= buffer.bytes;
  if (buffer.in_block) {  // back to the block's free part: the total stays
    live_ += buffer.bytes;
    arena_ += buffer.bytes;
  }
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
  peak_.arena = arena_;
  peak_.stored_micro_batches = stored_micro_batches_;
  peak_.staging_buffers.clear();
  for (int h : live_staging_) {
    const Buffer& buffer = buffers_[static_cast<size_t>(h)];
    peak_.staging_buffers.push_back({buffer.name, buffer.bytes});
  }
}

}  // namespace touchstone::plan
