// Replay of ContextParallelAttention's buffers (context_attention_replay.h), call by call in the order
// of parallel/context/context_attention.cpp.
#include "plan/context_attention_replay.h"

#include <string>
#include <vector>

namespace touchstone::plan {

namespace {

double kv_elements(const Dims& d) { return d.N * d.kv_heads * d.D; }  // n_kv

// The std::vectors of one attention call, freed together when it returns.
class CallBuffers {
 public:
  explicit CallBuffers(BufferTally& tally) : tally_(tally) {}
  ~CallBuffers() { tally_.release(handles_); }
  CallBuffers(const CallBuffers&) = delete;
  CallBuffers& operator=(const CallBuffers&) = delete;
  void alloc(double elements, const std::string& what) {
    handles_.push_back(tally_.alloc_outside_arena(elements, what));
  }

 private:
  BufferTally& tally_;
  std::vector<int> handles_;
};

// attention_block_forward / _backward: the tile scratch of every kernel thread, for the call.
void block_call(BufferTally& tally, double threads, double per_thread) {
  tally.release(tally.alloc_outside_arena(threads * per_thread, "attention tiles (per kernel thread)"));
}

}  // namespace

void replay_context_attention_forward(BufferTally& tally, const Dims& d, CpComm comm, double threads,
                                      ContextGroupBuffers cp) {
  const double n_kv = kv_elements(d);
  CallBuffers buffers(tally);
  if (comm == CpComm::kAllGather) {
    buffers.alloc(2 * n_kv, "cp: own K/V");
    buffers.alloc(2 * n_kv * d.cp, "cp: all-gathered K/V");
    buffers.alloc(n_kv * d.cp, "cp: K of the whole window");
    buffers.alloc(n_kv * d.cp, "cp: V of the whole window");
    block_call(tally, threads, d.attention_forward_scratch);
    return;
  }
  buffers.alloc(2 * n_kv, "cp: K/V block in use");
  if (d.cp > 1) buffers.alloc(2 * n_kv, "cp: K/V block arriving");
  buffers.alloc(d.N * d.heads * d.D, "cp: block output");
  buffers.alloc(d.windows * d.heads * d.T, "cp: block log-sum-exp");
  for (int step = 0; step < static_cast<int>(d.cp); ++step) {
    if (step + 1 < d.cp) cp.sends.send(2 * n_kv, "K/V block");
    block_call(tally, threads, d.attention_forward_scratch);
  }
  cp.sends.wait_sends();
}

void replay_context_attention_backward(BufferTally& tally, const Dims& d, CpComm comm, double threads,
                                       ContextGroupBuffers cp) {
  const double n_kv = kv_elements(d);
  CallBuffers buffers(tally);
  buffers.alloc(2 * n_kv, comm == CpComm::kAllGather ? "cp: own K/V" : "cp: K/V block in use");
  if (comm == CpComm::kAllGather) {
    buffers.alloc(2 * n_kv * d.cp, "cp: all-gathered K/V");
    buffers.alloc(n_kv * d.cp, "cp: K of the whole window");
    buffers.alloc(n_kv * d.cp, "cp: V of the whole window");
    buffers.alloc(n_kv * d.cp, "cp: dK of the whole window");
    buffers.alloc(n_kv * d.cp, "cp: dV of the whole window");
    block_call(tally, threads, d.attention_backward_scratch);
    cp.scratch.reduce_scatter_sum(2 * n_kv);
    return;
  }
  buffers.alloc(2 * n_kv, "cp: dK/dV accumulator");
  if (d.cp > 1) buffers.alloc(2 * n_kv, "cp: K/V block arriving");
  buffers.alloc(d.N * d.heads * d.D, "cp: block dQ");
  buffers.alloc(2 * n_kv, "cp: block dK/dV");
  for (int step = 0; step < static_cast<int>(d.cp); ++step) {
    if (step + 1 < d.cp) cp.sends.send(2 * n_kv, "K/V block");
    block_call(tally, threads, d.attention_backward_scratch);
    if (d.cp > 1) cp.sends.send(2 * n_kv, "dK/dV accumulator");
  }
  cp.sends.wait_sends();
}

}  // namespace touchstone::plan
