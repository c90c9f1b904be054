// Attention with the sequence split over the cp ranks of a context-parallel group (docs/parallelism.md,
// "Context parallelism"). Each rank holds the query, key and value rows of its two chunks of every
// window (LoadBalancedSplit); the keys and values of the other ranks reach it in one of two ways:
//
//   p2p (ring attention, Megatron-LM's default `--cp-comm-type p2p`)
//     forward   cp steps; at step s the rank computes its queries against the K/V block of rank
//               r - s (its own first) while passing that block on to rank r + 1, and merges each
//               block's output into the running one with the log-sum-exp rule (Backend::attention_merge)
//     backward  the K/V blocks go round the ring again, each with a dK/dV accumulator: at each step the
//               rank adds its queries' share of the block's gradients, then passes block and
//               accumulator on; one last pass brings every accumulator home. dQ sums the blocks' shares.
//   allgather (Llama 3's scheme)
//     forward   all-gather K and V of the whole window, one block call of the local queries against all
//     backward  the same block's gradients for every key, then a reduce-scatter returns each rank the
//               sum of the dK/dV of its own rows
//
// Neither keeps anything between forward and backward beyond what the model stores (q, k, v, out,
// lse), so the stored activations stay O(T / cp); the backward gathers or circulates K/V again.
// Every sum runs in a fixed order (ring order, or the group's rank-ordered reduce-scatter), so the bits
// do not depend on timing. Blocks that causality or document masking leave empty are skipped tile by
// tile by the kernels and counted in Backend::attention_tiles.
#pragma once

#include <cstdint>

#include "common/options.h"  // CpComm: how the keys and values travel (parallel.cp_comm)
#include "kernels/backend.h"
#include "parallel/comm/process_group.h"
#include "parallel/context/load_balanced_split.h"

namespace touchstone {

// Told when each transfer of the attention starts and ends (the all-gather, the reduce-scatter, each ring
// step's wait for the next block, the wait for the ring's sends), so that the trainer can draw them on
// the step's timeline (kContextTransfer, parallel/pipeline/timeline.h); the attention keeps no clock.
class ContextTransferObserver {
 public:
  virtual ~ContextTransferObserver() = default;
  virtual void transfer_begins() = 0;
  virtual void transfer_ends() = 0;
};

class ContextParallelAttention {
 public:
  ContextParallelAttention(ProcessGroup& cp, CpComm comm, Backend& backend)
      : cp_(cp), comm_(comm), backend_(backend) {}

  int cp_rank() const { return cp_.rank(); }
  int cp_size() const { return cp_.size(); }
  // The cp group: the caller names its transfers' site (ProcessGroup::set_site, the layer), to which
  // each ring step adds which rank's block it carries.
  ProcessGroup& group() const { return cp_; }
  void set_transfer_observer(ContextTransferObserver* observer) { observer_ = observer; }

  // Shapes: `local` is this rank's, local.seq = T / cp rows per window, so
  //   q[b,NH,Tl,D], k[b,NKV,Tl,D], v[b,NKV,Tl,D], out[b*Tl, NH*D], lse[b,NH,Tl]
  // with the rows of LoadBalancedSplit(T, cp).positions(cp_rank()) in each window.
  // window_document_ids[b*T]: the document ids of the whole windows (every rank has the packed batch, as
  // every Megatron-LM rank has the batch's cu_seqlens), from which the keys' documents of every rank
  // follow.
  void forward(const double* q, const double* k, const double* v, const int32_t* window_document_ids,
               bool document_masking, const AttentionDropout& dropout, const AttentionShape& local,
               double* out, double* lse) const;
  // dout[b*Tl, NH*D] -> dq[b,NH,Tl,D], dk[b,NKV,Tl,D], dv[b,NKV,Tl,D] (overwritten), from the forward's
  // inputs and its out and lse.
  void backward(const double* dout, const double* q, const double* k, const double* v, const double* out,
                const double* lse, const int32_t* window_document_ids, bool document_masking,
                const AttentionDropout& dropout, const AttentionShape& local, double* dq, double* dk,
                double* dv) const;

 private:
  ProcessGroup& cp_;
  CpComm comm_;
  Backend& backend_;
  ContextTransferObserver* observer_ = nullptr;
};

}  // namespace touchstone
