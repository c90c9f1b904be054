// The memory of the model's activations and working buffers, reused from one training step to the next
// so that the steady state allocates nothing: no page faults, no zero-fill.
//
// Every step makes the same buffers in the same order (same shapes, same schedule). The first step takes
// them from the heap and records each buffer's size and lifetime; at its end the arena lays all of them
// out in one block (greedy by size: the largest first, each at the lowest offset where no buffer whose
// lifetime overlaps it sits, as static memory planners do), and allocates that block once. From then on
// the k-th buffer of a step goes to its planned offset. Any request that does not match the plan (another
// size, a range still in use) is taken from the heap and counted, never placed over live data; a step
// with such requests is recorded and planned again. The memory planner runs the same layout on its replay
// of the step (plan/fp64_trainer_memory.h), so it predicts the block's size.
//
// Buffers are `ActivationBuffer` (a std::vector with ArenaAllocator): their elements are not initialised
// (the kernels write every element they later read), and each block carries a header naming its arena,
// so a buffer may be freed anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace touchstone {

// One buffer of a recorded step: its bytes (header included, rounded to the alignment) and the event
// indices of its allocation and its release (kNever: still live at the step's end, left out of the plan).
struct ArenaLifetime {
  static constexpr int64_t kNever = INT64_MAX;
  int64_t bytes = 0;
  int64_t allocated = 0, released = kNever;
};

// The offsets of greedy-by-size placement and the block size they need. Pure: the arena and the memory
// planner call it on the same lifetimes.
struct ArenaLayout {
  std::vector<int64_t> offsets;  // per lifetime; -1 for one never released
  int64_t bytes = 0;
};
ArenaLayout plan_arena_layout(const std::vector<ArenaLifetime>& lifetimes);

class ActivationArena {
 public:
  static constexpr int64_t kAlignment = 64;  // blocks and their data start on cache lines
  static constexpr int64_t kHeader = 64;     // bytes before each buffer's data
  // The bytes a buffer of `data_bytes` occupies, header included.
  static int64_t block_bytes(int64_t data_bytes);

  struct Stats {
    int64_t block_bytes = 0;  // the planned block, allocated once
    int64_t planned = 0;      // buffers placed in it, all steps
    int64_t heap = 0;         // buffers taken from the heap after a plan existed (not in the plan)
    int64_t plans = 0;        // layouts made
    int64_t steps = 0;
  };

  ActivationArena();  // registers it, so buffers freed after it is gone are told apart
  ~ActivationArena();
  ActivationArena(const ActivationArena&) = delete;
  ActivationArena& operator=(const ActivationArena&) = delete;

  // Makes this the arena of the buffers allocated on this thread for one step; the destructor ends
  // the step (and plans the layout after a recorded step). `another_step_follows` false (the run's
  // last step): a recorded step makes no layout, so a run of one step never allocates the block.
  class Step {
   public:
    explicit Step(ActivationArena* arena, bool another_step_follows = true);
    ~Step();
    Step(const Step&) = delete;
    Step& operator=(const Step&) = delete;

   private:
    ActivationArena* arena_;
    ActivationArena* previous_;
    bool another_step_follows_;
  };

  Stats stats() const;
  // Tests: every new buffer's elements are set to NaN, so a kernel that reads an element before
  // writing it changes the result.
  static void set_poison(bool on);

  // The allocator's calls: the current step's arena, or the heap when none.
  static void* allocate(size_t data_bytes);
  static void deallocate(void* data) noexcept;

 private:
  struct Header;
  void* take(int64_t data_bytes);
  void give_back(Header* header) noexcept;
  bool range_free(int64_t offset, int64_t end) const;
  void begin_step();
  void end_step(bool make_layout);

  mutable std::mutex mutex_;
  std::vector<ArenaLifetime> recorded_;  // this step's buffers in allocation order
  int64_t events_ = 0;                   // this step's allocations and releases so far
  int64_t serial_ = 0;                   // the step's number: a buffer of an earlier step is not recorded
  int64_t misses_ = 0;                   // this step's buffers that were not placed by the plan
  std::vector<int64_t> plan_offsets_;    // the layout the steps follow, per buffer index
  std::vector<int64_t> plan_bytes_;
  char* block_ = nullptr;
  int64_t block_size_ = 0;
  std::vector<std::pair<int64_t, int64_t>> live_;  // planned blocks in use: (offset, end), sorted
  Stats stats_;
};

// std::allocator's interface over ActivationArena; default-initialises (leaves doubles unset).
template <class T>
struct ArenaAllocator {
  using value_type = T;
  ArenaAllocator() = default;
  template <class U>
  ArenaAllocator(const ArenaAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(ActivationArena::allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t) noexcept { ActivationArena::deallocate(p); }
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // no value-initialisation: no zero-fill
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const ArenaAllocator<U>&) const noexcept {
    return true;
  }
};

using ActivationBuffer = std::vector<double, ArenaAllocator<double>>;

}  // namespace touchstone
