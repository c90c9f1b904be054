// The Llama-style decoder of docs/contract.md, "Model": forward and hand-written backward of one
// micro-batch on one pipeline stage and one tensor-parallel shard. Every operator is a call into the
// kernel interface (kernels/backend.h); every tensor-parallel transfer is a gather or reduce of a
// TensorParallelRegion (parallel/tensor/regions.h). With one stage and tp = 1 it is the whole model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/activation_arena.h"
#include "common/config.h"
#include "kernels/backend.h"
#include "model/param_table.h"
#include "parallel/context/context_attention.h"
#include "parallel/tensor/regions.h"

namespace touchstone {

// b windows of T positions, flattened to N = b*T rows. Pointers into the batch, each [N] except
// sample_indices [b]: the global sample index of each window, which keys its dropout masks (may be null
// when dropout is off).
//
// With context parallelism (cp > 1) a rank holds T/cp rows of each window (its two chunks,
// parallel/context/load_balanced_split.h): the [N] arrays above hold those rows only (N = b*T/cp),
// window_positions [N] says where each row sits in its window (it keys the hidden dropout masks), and
// window_document_ids [b*T] are the whole windows' document ids (the keys of every cp rank). Both are
// null without context parallelism, where row i of a window is position i.
struct MicroBatch {
  int64_t windows = 0;  // b
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  const int32_t* position_ids = nullptr;
  const int32_t* document_ids = nullptr;
  const int64_t* sample_indices = nullptr;
  const int32_t* window_positions = nullptr;
  const int32_t* window_document_ids = nullptr;
};

// The streams of layer l's dropout masks (docs/architecture.md "Dropout"): stream_key(seed, name) of
// "dropout/attention/layer{l}", "dropout/hidden_attn/layer{l}" and "dropout/hidden_mlp/layer{l}".
struct LayerDropoutKeys {
  PhiloxKey attention;         // the attention probabilities
  PhiloxKey hidden_attention;  // the attention block's output (after linear_proj)
  PhiloxKey hidden_mlp;        // the MLP block's output (after linear_fc2)
};
LayerDropoutKeys layer_dropout_keys(int64_t seed, int64_t layer);

// The layers [first_layer, end_layer) of one pipeline stage.
struct StageRange {
  int64_t first_layer = 0, end_layer = 0;
  bool first_stage = true, last_stage = true;
};

// What the forward pass keeps for the backward pass, per layer. Tl = the positions of each window this
// rank holds (T, or T/cp under context parallelism: two chunks of T/(2 cp) each); N = b x Tl; Nl = rows
// of the residual stream held by this rank (N, or N/tp with sequence parallelism); head and ffn counts
// are this rank's shares. The
// backward frees each tensor after its last use. Not stored, recomputed in the backward by the same
// kernel call on the same stored input (so with the same bits): the SwiGLU output silu(gate) * up from
// fc1, and without sequence parallelism (SP) the RMSNorm outputs from x_in and x_mid.
struct LayerActivations {
  ActivationBuffer x_in;       // [Nl,H]       residual stream entering the layer
  ActivationBuffer rstd_attn;  // [Nl]
  ActivationBuffer h_attn;     // [N,H]        input_layernorm output, full sequence; SP only
  ActivationBuffer q;          // [b,NHl,Tl,D]  after RoPE
  ActivationBuffer k;          // [b,NKVl,Tl,D] after RoPE
  ActivationBuffer v;          // [b,NKVl,Tl,D]
  ActivationBuffer lse;        // [b,NHl,Tl]    log-sum-exp of each query's scores (the softmax, in O(T))
  ActivationBuffer attn;       // [N,NHl*D]    attention output before linear_proj
  ActivationBuffer x_mid;      // [Nl,H]       residual stream after attention
  ActivationBuffer rstd_mlp;   // [Nl]
  ActivationBuffer h_mlp;      // [N,H]        pre_mlp_layernorm output, full sequence; SP only
  ActivationBuffer fc1;        // [N,2Fl]      [gate | up]

  // Hidden dropout masks, 0 or 1/(1-p); each empty when its dropout is off. (The attention dropout mask
  // is drawn inside the attention kernels, tile by tile, forward and backward alike.)
  ActivationBuffer hidden_attn_keep;  // [Nl,H]       of the attention block's output
  ActivationBuffer hidden_mlp_keep;   // [Nl,H]       of the MLP block's output
};

struct Activations {
  std::vector<LayerActivations> layers;  // this stage's layers
  ActivationBuffer x_final;              // [Nl,H] residual stream after the stage's last layer (the stage's
                                         //        output, sent to the next stage when not the last)
  // Last stage only:
  ActivationBuffer rstd_final;    // [Nl]
  ActivationBuffer h_final;       // [N,H]  final_layernorm output (the final hidden states)
  ActivationBuffer logits;        // [N,Vl] this rank's vocabulary slice (the head's backward overwrites
                                  //        it with dlogits, then frees it)
  ActivationBuffer row_max;       // [N]    over the whole vocabulary
  ActivationBuffer sum_exp;       // [N]
  ActivationBuffer token_losses;  // [N]    cross entropy per position, 0 where target = -100
};

// A unit of parameters the hooks below gather and free together (ParameterHooks).
struct ParameterUnit {
  enum class Kind { kEmbedding, kLayer, kHead };
  Kind kind;
  int64_t layer = -1;  // kLayer: the global layer number
};

// The weight-gradient half of a split backward (ZB-H1's W, docs/parallelism.md): the inputs of every
// weight-gradient call of one micro-batch's backward on this stage, kept by backward() when it is given
// one and run by backward_weights() later. The calls are the whole backward's, in its order, so each
// main gradient receives the same additions in the same order: the split changes no bit. RMSNorm weight
// gradients come from the same kernel call as the input gradient and stay in the first half.
struct DeferredWeightGradients {
  struct Linear {
    ActivationBuffer dy;  // [rows,out] the gradient of the output
    ActivationBuffer x;   // [rows,in]  the input
    int64_t rows = 0, in = 0, out = 0;
    double* dweight = nullptr;  // [out,in] the main gradient the call adds into
    size_t unit = 0;            // index into `units`
  };
  struct Embedding {
    ActivationBuffer dy;  // [rows,H] the gradient of the lookup (full sequence)
    const int32_t* tokens = nullptr;
    int64_t rows = 0;
    double* dtable = nullptr;  // [Vl,H]
    size_t unit = 0;
  };
  std::vector<Linear> linears;       // in the order the whole backward calls them
  std::vector<Embedding> embedding;  // first stage: one, after every linear
  // The units whose backward ran, in order: W tells the hooks when each unit's weight gradients are done.
  std::vector<ParameterUnit> units;
  bool empty() const { return linears.empty() && embedding.empty(); }
};

// The units whose parameters fully sharded data parallelism (parallel/data/fully_sharded_parameters.h)
// gathers just before a unit runs and frees after it, as FSDP2's hooks do around each module it wraps:
// the embedding, each decoder layer, the head (final norm and output layer). The model calls the hooks
// around each unit's forward and backward; between before_* and after_* the unit's tensors are in the
// `params` (and, in the backward, `grads`) the pass was given. A split backward (ZB-H1) ends a unit's
// backward with `weight_gradients_deferred`: its gradients must stay until after_weight_gradients, which
// backward_weights() calls once that micro-batch's W of the unit has added into them.
class ParameterHooks {
 public:
  virtual ~ParameterHooks() = default;
  virtual void before_forward(const ParameterUnit& unit) = 0;
  virtual void after_forward(const ParameterUnit& unit) = 0;
  virtual void before_backward(const ParameterUnit& unit) = 0;
  virtual void after_backward(const ParameterUnit& unit, bool weight_gradients_deferred) = 0;
  virtual void after_weight_gradients(const ParameterUnit& unit) = 0;
};

class Transformer {
 public:
  // `dropout_seed` (train.seed) keys the dropout masks; unused when model.*_dropout are 0. `cp`: the
  // context-parallel attention of a run with parallel.cp > 1 (then every batch holds T/cp rows per
  // window); null without context parallelism.
  Transformer(const ModelConfig& model, bool document_masking, int64_t dropout_seed, const ParamTable& table,
              Backend& backend, const TensorParallelRegion& tp, const StageRange& stage,
              const ContextParallelAttention* cp = nullptr);

  // `input` is the previous stage's output [Nl,H]; unused (may be null) on the first stage.
  void forward(const ParamTensors& params, const MicroBatch& batch, const ActivationBuffer* input,
               Activations& acts) const;

  // Adds the gradient of sum_n loss_weight * token_losses[n] to grads. On the last stage the loss is the
  // start (d_output unused); otherwise d_output [Nl,H] is the gradient of the stage's output. On other
  // than the first stage, d_input receives the gradient of the stage's input [Nl,H]. Consumes `acts`: it
  // frees each stored tensor once its last use is done (what is left is the caller's to drop).
  // With `deferred`, only the input gradients are computed (and the RMSNorm weight gradients): the
  // other weight gradients wait in `deferred` for backward_weights().
  void backward(const ParamTensors& params, const MicroBatch& batch, Activations& acts, double loss_weight,
                const ActivationBuffer* d_output, ParamTensors& grads, ActivationBuffer* d_input,
                DeferredWeightGradients* deferred = nullptr) const;
  // The weight gradients a split backward left in `deferred`, added to the gradients it names; empties it.
  void backward_weights(DeferredWeightGradients& deferred) const;

  // Hooks around each unit's passes (none by default); the caller keeps them alive.
  void set_parameter_hooks(ParameterHooks* hooks) { hooks_ = hooks; }

  const StageRange& stage() const { return stage_; }
  Backend& backend() const { return backend_; }
  int64_t local_rows(int64_t windows) const { return tp_.local_rows(windows * seq_); }
  int64_t hidden_size() const { return model_.hidden_size; }

 private:
  AttentionShape attention_shape(int64_t windows) const;
  // Names the tp group's transfers of a scope for the trace: "<module> <operation>", the module by its
  // Megatron-Core name and the operation in Megatron-LM's words (ColumnParallelLinear, ...).
  TransferSite tp_site(const std::string& module, const std::string& operation) const;
  // What a RowParallelLinear exit (or a ColumnParallelLinear's input gradient) does with partial sums.
  std::string tp_reduce_words() const;
  int64_t vocab_local() const { return model_.vocab_size / tp_.tp_size(); }
  int64_t vocab_start() const { return tp_.tp_rank() * vocab_local(); }

  DropoutSite dropout_site(const PhiloxKey& key, double probability, const MicroBatch& batch) const;
  // The attention dropout of `layer` for this rank's heads (none when off).
  AttentionDropout attention_dropout(int64_t layer, const MicroBatch& batch) const;
  // RMSNorm of the residual stream x[Nl,H] into h[N,H], the full sequence, and rstd[Nl]: with sequence
  // parallelism the all-gather of the local rows (the ColumnParallelLinear entry), else the local output
  // itself (the entry is the identity there).
  void norm_gather(const double* x, const std::vector<double>& weight, int64_t windows, ActivationBuffer& h,
                   ActivationBuffer& rstd) const;
  // Hidden dropout of a block's output out[Nl,H] in place, keeping its mask in `keep` (left empty when off).
  void hidden_dropout_forward(const PhiloxKey& key, const MicroBatch& batch, ActivationBuffer& out,
                              ActivationBuffer& keep) const;
  // The residual add at a block's end, x <- x + branch [Nl,H], keeping the block's input x in `kept` for
  // the backward: the sum goes into the branch's buffer as branch + x (addition commutes, so the bits
  // are those of x + branch), which becomes the stream, and x itself moves into `kept`, with no copy.
  void keep_and_advance(ActivationBuffer& x, ActivationBuffer& branch, ActivationBuffer& kept) const;
  // The gradient before the hidden dropout: dx * keep in `scratch`, or dx itself when off.
  ActivationBuffer& hidden_dropout_backward(ActivationBuffer& dx, const ActivationBuffer& keep,
                                            ActivationBuffer& scratch) const;
  // The output gradient [N,H] of a block's RowParallelLinear, from the residual stream's dx [Nl,H]: the
  // hidden dropout's backward (hidden_dropout_backward), then the exit's backward, the all-gather into
  // `full` with sequence parallelism. Without it the rows are already all there and are not copied,
  // unless the split backward keeps them for its W: then `full` holds a copy, as dx goes on changing.
  // The result lives as long as dx, `scratch` and `full`.
  ActivationBuffer& row_parallel_output_grad(ActivationBuffer& dx, int64_t N, const ActivationBuffer& keep,
                                             ActivationBuffer& scratch, ActivationBuffer& full,
                                             const DeferredWeightGradients* deferred) const;

  void attention_block_forward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                               LayerActivations& a, ActivationBuffer& x) const;
  void attention_block_backward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                                LayerActivations& a, ActivationBuffer& dx, ParamTensors& grads,
                                DeferredWeightGradients* deferred) const;
  void mlp_block_forward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                         LayerActivations& a, ActivationBuffer& x) const;
  void mlp_block_backward(const ParamTensors& params, int64_t layer, const MicroBatch& batch,
                          LayerActivations& a, ActivationBuffer& dx, ParamTensors& grads,
                          DeferredWeightGradients* deferred) const;
  void head_forward(const ParamTensors& params, const MicroBatch& batch, Activations& acts) const;
  void head_backward(const ParamTensors& params, const MicroBatch& batch, Activations& acts,
                     double loss_weight, ParamTensors& grads, ActivationBuffer& dx,
                     DeferredWeightGradients* deferred) const;
  // dx[rows,in] = dy W now; dweight[out,in] += dy^T x now, or, with `deferred`, later from dy (moved
  // into it) and a copy of x.
  void linear_backward(ActivationBuffer& dy, const ActivationBuffer& x, const double* weight, int64_t rows,
                       int64_t in, int64_t out, double* dx, double* dweight,
                       DeferredWeightGradients* deferred) const;
  // The weight gradient alone, for a layer whose dx was computed before its input x was at hand (the MLP's
  // fc2: act comes out of SwiGLU's backward): dweight += dy^T x now, or, with `deferred`, later from dy
  // and x, both moved into it.
  void linear_weight_gradient(ActivationBuffer& dy, ActivationBuffer& x, int64_t rows, int64_t in,
                              int64_t out, double* dweight, DeferredWeightGradients* deferred) const;

  // The hooks' calls around one unit (nothing without hooks). A split backward also lists the unit in
  // `deferred`, so that its W records name the unit they add into.
  enum Pass { kForward, kBackward };
  void before(Pass pass, const ParameterUnit& unit, DeferredWeightGradients* deferred = nullptr) const;
  void after(Pass pass, const ParameterUnit& unit, const DeferredWeightGradients* deferred = nullptr) const;

  ModelConfig model_;
  bool document_masking_;
  const ParamTable& table_;
  Backend& backend_;
  const TensorParallelRegion& tp_;
  StageRange stage_;
  const ContextParallelAttention* cp_;  // null without context parallelism
  int64_t seq_;                         // rows of each window on this rank: T, or T / cp
  ParameterHooks* hooks_ = nullptr;
  std::vector<LayerDropoutKeys> dropout_keys_;  // [num_layers], by global layer index
};

}  // namespace touchstone
