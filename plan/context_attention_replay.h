// Allocation replay of ContextParallelAttention (parallel/context/context_attention.cpp): the buffers
// one layer's context-parallel attention allocates beside the model's own q, k, v, out and lse, in the
// order of the code, for the ring (p2p) and the all-gather. They are std::vectors of that file, on the
// heap outside the activation arena, and all of them are freed when the call returns. The cp group's
// send copies and reduce-scatter scratch are the communication layer's (comm_staging.h).
//
// Sizes on one rank (Dims: N = b T / cp rows, NKVl KV heads, D head dimension, NHl query heads):
//   n_kv = N NKVl D     one of K or V of this rank's rows
//   ring forward        kv [2 n_kv] (the block in use), arriving [2 n_kv], block_out [N NHl D],
//                       block_lse [b NHl T/cp], a send copy of kv [2 n_kv] per ring step but the last
//   ring backward       kv, dkv (the accumulator), arriving [2 n_kv each], block_dq [N NHl D],
//                       block_dkv [2 n_kv], two send copies of [2 n_kv] per step (kv but at the last step,
//                       and dkv)
//   all-gather forward  kv [2 n_kv], gathered [2 n_kv cp], k_all, v_all [n_kv cp each]
//   all-gather backward kv, gathered, k_all, v_all, dk_all, dv_all [n_kv cp each], and the reduce-scatter
//                       of [2 n_kv] per rank through the group's exchange scratch
// Each block call holds the attention kernel's tile scratch per kernel thread. The int32 row indices
// (positions and documents of the queries and keys, b T / cp or b T of each) are left out: they are
// below the margin memory_per_rank allows for bookkeeping.
#pragma once

#include "common/options.h"
#include "plan/buffer_tally.h"
#include "plan/comm_staging.h"
#include "plan/fp64_pass_replay.h"

namespace touchstone::plan {

// The cp group's communication buffers on one rank.
struct ContextGroupBuffers {
  GroupScratch& scratch;  // the reduce-scatter of the all-gather's backward
  SendCopies& sends;      // the ring's sends
};

void replay_context_attention_forward(BufferTally& tally, const Dims& d, CpComm comm, double threads,
                                      ContextGroupBuffers cp);
void replay_context_attention_backward(BufferTally& tally, const Dims& d, CpComm comm, double threads,
                                       ContextGroupBuffers cp);

}  // namespace touchstone::plan
