// The attention of two context-parallel mistakes, for the hypotheses of touchstone diff (hypotheses.cpp).
// A run with context parallelism cp splits each window over cp ranks (LoadBalancedSplit: rank r holds
// chunks r and 2cp-1-r of the window cut in 2cp) and computes attention over blocks of keys. This backend
// plays on one rank what cp ranks compute over the whole window with one rule wrong:
//
//   kMergeWithoutLse   ring attention (parallel.cp_comm = p2p) adding the blocks' outputs as they are.
//                      Every query meets the K/V block of every cp rank s (its chunks s and 2cp-1-s),
//                      and each block's output is normalised over that block's keys alone:
//                        out_i = sum_s softmax_{j in block s, allowed(i,j)}(q_i k_j^T / sqrt(D)) v_j
//                      instead of the log-sum-exp merge out_i = sum_s exp(lse_s,i - lse_i) out_s,i
//                      (Backend::attention_merge). A block with no key a query may see adds 0. The
//                      backward is this function's own: each block's softmax backward with its own out_s
//                      and lse_s, d out_s = d out.
//   kChunksNotLoadBalanced
//                      the ranks hold contiguous slices of each window (rank r: rows [r T/cp, (r+1) T/cp))
//                      with their tokens, targets and document ids, while the positions are those the
//                      load-balanced split gives the same slot of the same rank: slot i of the window
//                      attends, and is attended to, as position p(i) = LoadBalancedSplit(T, cp)
//                      .positions(i / (T/cp))[i % (T/cp)] (the causal mask compares p, the document mask
//                      the ids as they are). The RoPE position ids are permuted the same way, by the
//                      caller (load_balanced_slot_positions).
//
// Everything else is the FP64 CPU reference backend. Only whole-window attention calls are expected
// (one rank: query and key rows are the window's positions 0..T-1).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace touchstone::diff {

enum class ContextParallelMistake { kMergeWithoutLse, kChunksNotLoadBalanced };

// p(i) above for a window of T positions: [T].
std::vector<int32_t> load_balanced_slot_positions(int64_t seq, int cp);

class ContextParallelMistakeBackend : public CpuBackend {
 public:
  ContextParallelMistakeBackend(ContextParallelMistake mistake, int cp)
      : CpuBackend(BackendOptions{}), mistake_(mistake), cp_(cp) {}  // FP64
  std::string name() const override;

  void attention_block_forward(const double* q, const double* k, const double* v, const AttentionBlock& block,
                               bool document_masking, const AttentionDropout& dropout,
                               const AttentionShape& shape, double* out, double* lse) override;
  void attention_block_backward(const double* dout, const double* q, const double* k, const double* v,
                                const double* out, const double* lse, const AttentionBlock& block,
                                bool document_masking, const AttentionDropout& dropout,
                                const AttentionShape& shape, double* dq, double* dk, double* dv) override;

 private:
  ContextParallelMistake mistake_;
  int cp_;
};

}  // namespace touchstone::diff
