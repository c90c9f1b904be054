// Allocation replay of Transformer::forward and Transformer::backward (model/transformer.cpp) of one
// micro-batch on one rank, including the tensor-parallel group's reduction scratch. Used by the step
// replay of fp64_trainer_memory.cpp.
#pragma once

#include <vector>

#include "plan/buffer_tally.h"
#include "plan/comm_staging.h"
#include "plan/fp64_trainer_memory.h"

namespace touchstone::plan {

// Shapes on a rank: N = b*T rows, Nl = N/tp with sequence parallelism (else N), and this rank's heads,
// KV heads, ffn columns and vocabulary rows (each / tp).
struct Dims {
  double N, Nl, H, D, heads, kv_heads, ffn, vocab, windows, T;
  bool sp;
  // Doubles of attention scratch per kernel thread, forward and backward (CpuBackend).
  double attention_forward_scratch, attention_backward_scratch;
};
Dims dims_of(const Fp64Rank& rank);

class PassReplay {
 public:
  PassReplay(BufferTally& tally, const Fp64Rank& rank, GroupScratch& tp_scratch)
      : l_(tally),
        d_(dims_of(rank)),
        r_(rank),
        tp_(tp_scratch),
        threads_(static_cast<double>(rank.kernel_threads)) {}

  // One micro-batch's forward; returns the handles of what its Activations hold. With `breakdown`, the
  // first layer's and the head's stored tensors are named there.
  std::vector<int> forward(Fp64StepReplay* breakdown);
  // One micro-batch's backward; returns the handle of the input gradient it hands to the executor (-1 on
  // the first stage).
  int backward();

 private:
  struct Keeper;
  int gather(const std::string& what);
  int reduce(int partial, const std::string& what);
  void attention_forward(Keeper k);
  void mlp_forward(Keeper k);
  void head_forward(Keeper k);
  std::vector<int> hidden_dropout_scratch();
  void attention_backward();
  void mlp_backward();

  BufferTally& l_;
  Dims d_;
  const Fp64Rank& r_;
  GroupScratch& tp_;
  double threads_;
};

}  // namespace touchstone::plan
