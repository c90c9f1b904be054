// The bookkeeping of an allocation replay (fp64_trainer_memory.h): the bytes of every replayed buffer,
// the live total, and a snapshot of the largest live total with what it was made of. Buffers are of
// three kinds, so that a peak can be written as stored activations + working buffers + communication
// staging buffers, each of which a reader can check on its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/activation_arena.h"
#include "plan/memory_plan.h"

namespace touchstone::plan {

enum class BufferKind {
  kStored,   // an activation the forward keeps for the backward
  kWorking,  // a buffer of the passes, the executor, the loss gather or the optimizer update
  kStaging,  // the communication layer's own buffers (parallel/comm/mpi_group.cpp)
  kArena,    // the free part of the activation arena's block (common/activation_arena.h), which is
             // allocated at the first step's end; the buffers in it count as stored or working
};

// What was live at the largest total.
struct PeakSnapshot {
  NamedBytes at;  // where in the step, and all live bytes
  double stored = 0, working = 0, staging = 0, arena = 0;
  int64_t stored_micro_batches = 0;         // micro-batches whose stored activations were all live
  std::vector<NamedBytes> staging_buffers;  // each live staging buffer
};

class BufferTally {
 public:
  // Elements of 8 bytes (FP64); returns the handle to release. Inside an arena step a stored or working
  // buffer is an ActivationBuffer: with its header and rounding while the arena records (the first
  // step), and inside the block (no bytes of its own) once the arena has its layout.
  int alloc(double elements, const std::string& what, BufferKind kind = BufferKind::kWorking);
  // A std::vector made inside an arena step (a kernel's scratch, a copy the caller keeps): on the heap.
  int alloc_outside_arena(double elements, const std::string& what);
  // The scope of ActivationArena::Step (Trainer::step's passes); its end lays out a recorded step's
  // buffers (plan_arena_layout) and allocates the block, which stays live.
  void begin_arena_step();
  void end_arena_step(bool make_layout = true);  // false: the run's last step (no block)
  void release(int handle);                      // releasing twice (a moved-from buffer) frees nothing
  void release(const std::vector<int>& handles);
  // A working buffer moved into the micro-batch's Activations (the residual stream becomes x_final).
  void store(int handle);
  double bytes(int handle) const { return buffers_[static_cast<size_t>(handle)].bytes; }
  double live() const { return live_; }
  // Where allocations happen: the step and micro-batch (or phase), then the part of the model.
  void context(const std::string& context) { context_ = context.empty() ? "" : context + ", "; }
  void at(std::string where) { where_ = std::move(where); }
  // Micro-batches whose forward has finished and whose backward has not yet released them.
  void set_stored_micro_batches(int64_t count) { stored_micro_batches_ = count; }
  const PeakSnapshot& peak() const { return peak_; }
  // Starts a new peak from the live bytes (the tracker's reset_peak() at a step's start).
  void reset_peak();

 private:
  struct Buffer {
    double bytes;
    BufferKind kind;
    std::string name;  // staging buffers only: named in the peak's breakdown
    int64_t lifetime;  // index in the arena step's record, or -1
    bool in_block;     // placed in the arena's block: its bytes are part of the block's
  };
  int add(double bytes, const std::string& what, BufferKind kind, int64_t lifetime);
  double& live_of(BufferKind kind);
  void take_snapshot(const std::string& what);

  std::vector<Buffer> buffers_;
  std::vector<int> live_staging_;
  double live_ = 0, stored_ = 0, working_ = 0, staging_ = 0, arena_ = 0;
  bool in_arena_step_ = false, arena_planned_ = false;
  std::vector<ArenaLifetime> arena_record_;
  int64_t arena_events_ = 0;
  int64_t stored_micro_batches_ = 0;
  PeakSnapshot peak_;
  std::string context_, where_;
};

}  // namespace touchstone::plan
