// Allocation replay of Transformer::forward and Transformer::backward (model/transformer.cpp) of one
// micro-batch on one rank, including the tensor-parallel group's reduction scratch. Used by the step
// replay of fp64_trainer_memory.cpp.
#pragma once

#include <map>
#include <vector>

#include "plan/buffer_tally.h"
#include "plan/comm_staging.h"
#include "plan/fp64_trainer_memory.h"

namespace touchstone::plan {

// Shapes on a rank: T = this rank's positions of a window (seq / cp), N = b*T rows, Nl = N/tp with
// sequence parallelism (else N), and this rank's heads, KV heads, ffn columns and vocabulary rows
// (each / tp).
struct Dims {
  double N, Nl, H, D, heads, kv_heads, ffn, vocab, windows, T, cp;
  bool sp;
  // Doubles of attention scratch per kernel thread, forward and backward (CpuBackend).
  double attention_forward_scratch, attention_backward_scratch;
};
Dims dims_of(const Fp64Rank& rank);

// The handles of one micro-batch's stored activations (-1: not stored), which its backward frees one by
// one as the model does.
struct LayerStored {
  int x_in = -1, rstd_attn = -1, h_attn = -1, q = -1, k = -1, v = -1, lse = -1, attn = -1, attn_keep = -1;
  int x_mid = -1, rstd_mlp = -1, h_mlp = -1, fc1 = -1, mlp_keep = -1;
};
struct PassStored {
  std::vector<int> all;  // every handle: the executor drops what the backward left
  std::vector<LayerStored> layers;
  int x_final = -1, rstd_final = -1, h_final = -1, logits = -1, row_max = -1, sum_exp = -1;
};

// What one micro-batch's split backward leaves for its W (model/transformer.h DeferredWeightGradients):
// the buffers the W calls read, and the zero-stage-3 units whose gradients they add into, in order.
struct DeferredReplay {
  std::vector<int> buffers;
  std::vector<std::vector<const HeldTensor*>> units;
};

// Dim0Shard::reduce_scatter_add (parallel/data/dim0_shard.cpp) of tensor t: the gradient copied into a
// buffer of dp x cp shards, this rank's reduced chunk, and the group's exchange scratch.
void replay_reduce_scatter_add(BufferTally& tally, GroupScratch& dp, const Fp64Rank& rank,
                               const HeldTensor& t);

// The communication buffers a pass uses: the reduction scratch of the tp group and of the group that
// reduces gradients (dp x cp, for zero stage 3's units), and the cp group's scratch and sends.
struct PassGroups {
  GroupScratch& tp;
  GroupScratch& dp_cp;
  GroupScratch& cp;
  SendCopies& cp_sends;
};

class PassReplay {
 public:
  PassReplay(BufferTally& tally, const Fp64Rank& rank, PassGroups groups)
      : l_(tally),
        d_(dims_of(rank)),
        r_(rank),
        tp_(groups.tp),
        dp_(groups.dp_cp),
        cp_(groups.cp),
        cp_sends_(groups.cp_sends),
        threads_(static_cast<double>(rank.kernel_threads)) {}

  // One micro-batch's forward through one of the stage's model chunks; returns the handles of what its
  // Activations hold. With `breakdown`, the first layer's and the head's stored tensors are named there.
  PassStored forward(const Fp64Chunk& chunk, Fp64StepReplay* breakdown);
  // One micro-batch's backward, freeing `stored` as it goes; returns the handle of the input gradient it
  // hands to the executor (-1 on the first stage). With `deferred`, the first half of a split backward
  // (model/transformer.h DeferredWeightGradients): what its W half keeps is added there.
  int backward(const Fp64Chunk& chunk, PassStored& stored, DeferredReplay* deferred = nullptr);
  // Transformer::backward_weights of that W: unit by unit, the last pending W of a zero-stage-3 tensor
  // reduce-scatters its gradient and frees it; then the kept buffers go. Empties `deferred`.
  void backward_weights(DeferredReplay& deferred);

 private:
  struct Keeper;
  void free(int handle) {
    if (handle >= 0) l_.release(handle);
  }
  int row_parallel_output_grad(const std::string& what);
  int reduce(int partial, const std::string& what);
  int norm_gather(const std::string& what, BufferKind kind);
  int recompute_norm(const std::string& what);
  int keep_and_advance(Keeper k, int& x, int branch, const std::string& what);
  // x: the residual stream's buffer, in and out (a block's end moves it into the stored input).
  LayerStored attention_forward(Keeper k, int& x);
  void mlp_forward(Keeper k, LayerStored& s, int& x);
  void head_forward(Keeper k, PassStored& s);
  std::vector<int> hidden_dropout_scratch();
  void attention_backward(LayerStored& s);
  void mlp_backward(LayerStored& s);
  int head_backward(PassStored& s);
  // Transformer::linear_backward: with a split backward, W keeps the output gradient `dy` and a copy of
  // the input (x_elements). Returns whether dy was kept (otherwise the caller frees it, as the model).
  bool keep_for_weights(int dy, double x_elements, const std::string& x_name);

  // Zero stage 3 (parallel/data/fully_sharded_parameters.cpp): one unit's gathered parameters (and, in
  // its backward, its full gradients) from before its pass to after it; nothing at other stages. A split
  // backward's gradients stay after it, each tensor counting the W still to add into it.
  enum class Unit { kEmbedding, kLayer, kHead };
  struct UnitBuffers {
    std::vector<const HeldTensor*> tensors;
    std::vector<int> params;
    bool backward = false;
  };
  struct UnitGradient {
    int handle = -1;
    int pending_weights = 0;
  };
  UnitBuffers unit_before(Unit unit, int64_t layer, bool backward);
  // A backward's gradients are reduce-scattered first, unless a W will still add into them.
  void unit_after(UnitBuffers& buffers);
  void reduce_scatter_unit_gradient(const HeldTensor* t);

  BufferTally& l_;
  Dims d_;
  const Fp64Rank& r_;
  GroupScratch& tp_;
  GroupScratch& dp_;
  GroupScratch& cp_;
  SendCopies& cp_sends_;
  double threads_;
  DeferredReplay* deferred_ = nullptr;                    // during a split backward's first half
  std::map<const HeldTensor*, UnitGradient> unit_grads_;  // zero stage 3: full gradients held now
  const Fp64Chunk* chunk_ = nullptr;                      // the chunk of the pass that runs
};

}  // namespace touchstone::plan
