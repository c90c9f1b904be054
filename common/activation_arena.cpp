// Record, plan, reuse: the activation arena of activation_arena.h.
#include "common/activation_arena.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <numeric>

namespace touchstone {

namespace {

thread_local ActivationArena* t_current = nullptr;
bool g_poison = false;

// The arenas alive now: a buffer freed after its arena is gone goes back to the heap (or, if it was
// planned, stays in the block, which the arena leaves allocated while buffers live in it).
std::mutex g_registry_mutex;
std::vector<const ActivationArena*>& registry() {
  static std::vector<const ActivationArena*> arenas;
  return arenas;
}
// A heap block of `bytes`, header included, aligned as the arena's blocks are.
void* heap_block(int64_t bytes) {
  return ::operator new (static_cast<size_t>(bytes), std::align_val_t{ActivationArena::kAlignment});
}

bool registered(const ActivationArena* arena) {
  const std::lock_guard<std::mutex> lock(g_registry_mutex);
  const auto& arenas = registry();
  return std::find(arenas.begin(), arenas.end(), arena) != arenas.end();
}

}  // namespace

struct ActivationArena::Header {
  ActivationArena* arena;  // null: taken from the heap outside any step
  int64_t serial;          // the step that allocated it
  int64_t index;           // its index among that step's buffers
  int64_t offset;          // in the block, or -1 when it came from the heap
};

int64_t ActivationArena::block_bytes(int64_t data_bytes) {
  return kHeader + (data_bytes + kAlignment - 1) / kAlignment * kAlignment;
}

ArenaLayout plan_arena_layout(const std::vector<ArenaLifetime>& lifetimes) {
  const auto n = static_cast<int64_t>(lifetimes.size());
  ArenaLayout layout;
  layout.offsets.assign(static_cast<size_t>(n), -1);
  std::vector<int64_t> order;
  for (int64_t i = 0; i < n; ++i)
    if (lifetimes[static_cast<size_t>(i)].released != ArenaLifetime::kNever) order.push_back(i);
  // Largest first; equal sizes in allocation order, so the layout is a function of the lifetimes alone.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return lifetimes[static_cast<size_t>(a)].bytes > lifetimes[static_cast<size_t>(b)].bytes;
  });
  std::vector<int64_t> placed;
  std::vector<std::pair<int64_t, int64_t>> taken;  // (offset, end) of placed buffers alive at the same time
  for (int64_t i : order) {
    const ArenaLifetime& me = lifetimes[static_cast<size_t>(i)];
    taken.clear();
    for (int64_t j : placed) {
      const ArenaLifetime& other = lifetimes[static_cast<size_t>(j)];
      if (other.allocated < me.released && me.allocated < other.released) {
        const int64_t offset = layout.offsets[static_cast<size_t>(j)];
        taken.emplace_back(offset, offset + other.bytes);
      }
    }
    std::sort(taken.begin(), taken.end());
    // The smallest gap between the taken ranges that holds it; else above them all.
    int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max(), cursor = 0;
    for (const auto& [offset, end] : taken) {
      const int64_t gap = offset - cursor;
      if (gap >= me.bytes && gap < best_gap) {
        best = cursor;
        best_gap = gap;
      }
      cursor = std::max(cursor, end);
    }
    if (best < 0) best = cursor;
    layout.offsets[static_cast<size_t>(i)] = best;
    layout.bytes = std::max(layout.bytes, best + me.bytes);
    placed.push_back(i);
  }
  return layout;
}

ActivationArena::ActivationArena() {
  const std::lock_guard<std::mutex> lock(g_registry_mutex);
  registry().push_back(this);
}

ActivationArena::~ActivationArena() {
  {
    const std::lock_guard<std::mutex> lock(g_registry_mutex);
    std::erase(registry(), this);
  }
  // A buffer still in the block keeps it: its memory stays valid, and is never reused.
  if (live_.empty()) ::operator delete (block_, std::align_val_t{kAlignment});
}

ActivationArena::Step::Step(ActivationArena* arena, bool another_step_follows)
    : arena_(arena), previous_(t_current), another_step_follows_(another_step_follows) {
  if (arena_ == nullptr) return;
  arena_->begin_step();
  t_current = arena_;
}

ActivationArena::Step::~Step() {
  if (arena_ == nullptr) return;
  t_current = previous_;
  arena_->end_step(another_step_follows_);
}

void ActivationArena::begin_step() {
  const std::lock_guard<std::mutex> lock(mutex_);
  ++serial_;
  recorded_.clear();
  events_ = 0;
  misses_ = 0;
}

void ActivationArena::end_step(bool make_layout) {
  const std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.steps;
  // Plan after the first step, and again after a step the plan did not fit, once no planned buffer is
  // alive (the block may then be replaced); not after a last step, which no step would reuse.
  if (make_layout && (plan_offsets_.empty() || misses_ > 0) && live_.empty() && !recorded_.empty()) {
    const ArenaLayout layout = plan_arena_layout(recorded_);
    if (layout.bytes > block_size_) {
      ::operator delete (block_, std::align_val_t{kAlignment});
      block_ = nullptr;
      block_size_ = 0;
      block_ = static_cast<char*>(heap_block(layout.bytes));
      block_size_ = layout.bytes;
      // Touch every page now, so that the kernel's page faults and zero-fill land here, at the end of
      // the recording step, and not in the next step, the first to use the block.
      constexpr int64_t kPage = 4096;
      for (int64_t at = 0; at < block_size_; at += kPage) block_[at] = 0;
    }
    plan_offsets_ = layout.offsets;
    plan_bytes_.clear();
    for (const ArenaLifetime& b : recorded_) plan_bytes_.push_back(b.bytes);
    stats_.block_bytes = block_size_;
    ++stats_.plans;
  }
}

ActivationArena::Stats ActivationArena::stats() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void ActivationArena::set_poison(bool on) { g_poison = on; }

bool ActivationArena::range_free(int64_t offset, int64_t end) const {
  // live_ is sorted by offset and its ranges never overlap: only the neighbours can touch [offset, end).
  const auto it = std::lower_bound(live_.begin(), live_.end(), std::make_pair(offset, int64_t{0}));
  if (it != live_.end() && it->first < end) return false;
  if (it != live_.begin() && std::prev(it)->second > offset) return false;
  return true;
}

void* ActivationArena::take(int64_t data_bytes) {
  const int64_t bytes = block_bytes(data_bytes);
  void* memory = nullptr;
  int64_t offset = -1;
  int64_t index = 0, serial = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    serial = serial_;
    index = static_cast<int64_t>(recorded_.size());
    recorded_.push_back({bytes, events_++, ArenaLifetime::kNever});
    const auto i = static_cast<size_t>(index);
    if (i < plan_offsets_.size() && plan_bytes_[i] == bytes && plan_offsets_[i] >= 0 &&
        range_free(plan_offsets_[i], plan_offsets_[i] + bytes)) {
      offset = plan_offsets_[i];
      live_.insert(std::lower_bound(live_.begin(), live_.end(), std::make_pair(offset, int64_t{0})),
                   {offset, offset + bytes});
      memory = block_ + offset;
      ++stats_.planned;
    } else if (!plan_offsets_.empty()) {
      ++misses_;
      ++stats_.heap;
    }
  }
  if (memory == nullptr) memory = heap_block(bytes);
  auto* header = static_cast<Header*>(memory);
  static_assert(sizeof(Header) <= kHeader);
  *header = Header{this, serial, index, offset};
  return static_cast<char*>(memory) + kHeader;
}

void ActivationArena::give_back(Header* header) noexcept {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (header->serial == serial_ && header->index < static_cast<int64_t>(recorded_.size()))
      recorded_[static_cast<size_t>(header->index)].released = events_++;
    if (header->offset >= 0) {
      const auto it =
          std::lower_bound(live_.begin(), live_.end(), std::make_pair(header->offset, int64_t{0}));
      if (it != live_.end() && it->first == header->offset) live_.erase(it);
      return;
    }
  }
  ::operator delete (header, std::align_val_t{kAlignment});
}

void* ActivationArena::allocate(size_t data_bytes) {
  if (data_bytes > static_cast<size_t>(std::numeric_limits<int64_t>::max() / 2)) throw std::bad_alloc();
  void* data = nullptr;
  if (t_current != nullptr) {
    data = t_current->take(static_cast<int64_t>(data_bytes));
  } else {
    void* memory = heap_block(block_bytes(static_cast<int64_t>(data_bytes)));
    *static_cast<Header*>(memory) = Header{nullptr, 0, 0, -1};
    data = static_cast<char*>(memory) + kHeader;
  }
  if (g_poison) std::fill_n(static_cast<double*>(data), data_bytes / sizeof(double), std::nan(""));
  return data;
}

void ActivationArena::deallocate(void* data) noexcept {
  if (data == nullptr) return;
  auto* header = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeader);
  if (header->arena != nullptr && registered(header->arena)) {
    header->arena->give_back(header);
  } else if (header->offset < 0) {
    ::operator delete (header, std::align_val_t{kAlignment});
  }  // else: planned in an arena that is gone, which left its block allocated
}

}  // namespace touchstone
