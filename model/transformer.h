// The Llama-style decoder of CONTRACTS.md section 2: forward and hand-written backward of one
// micro-batch, every operator a call into the kernel interface (kernels/backend.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/config.h"
#include "model/param_table.h"

namespace touchstone {

// b windows of T positions, flattened to N = b*T rows. Pointers into the batch, each [N].
struct MicroBatch {
  int64_t windows = 0;  // b
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  const int32_t* position_ids = nullptr;
  const int32_t* document_ids = nullptr;
};

// What the forward pass keeps for the backward pass, per layer.
struct LayerActivations {
  std::vector<double> x_in;      // [N,H]     residual stream entering the layer
  std::vector<double> h_attn;    // [N,H]     input_layernorm output
  std::vector<double> rstd_attn; // [N]
  std::vector<double> q;         // [b,NH,T,D] after RoPE
  std::vector<double> k;         // [b,NKV,T,D] after RoPE
  std::vector<double> v;         // [b,NKV,T,D]
  std::vector<double> probs;     // [b,NH,T,T] attention probabilities
  std::vector<double> attn;      // [N,NH*D]  attention output before linear_proj
  std::vector<double> x_mid;     // [N,H]     residual stream after attention
  std::vector<double> h_mlp;     // [N,H]     pre_mlp_layernorm output
  std::vector<double> rstd_mlp;  // [N]
  std::vector<double> fc1;       // [N,2F]    [gate | up]
  std::vector<double> act;       // [N,F]     silu(gate) * up
};

struct Activations {
  std::vector<LayerActivations> layers;
  std::vector<double> x_final;      // [N,H] residual stream after the last layer
  std::vector<double> rstd_final;   // [N]
  std::vector<double> h_final;      // [N,H] final_layernorm output (the final hidden states)
  std::vector<double> logits;       // [N,V]
  std::vector<double> token_losses; // [N]   cross entropy per position, 0 where target = -100
};

class Transformer {
 public:
  Transformer(const ModelConfig& model, bool document_masking, const ParamTable& table, Backend& backend);

  void forward(const ParamTensors& params, const MicroBatch& batch, Activations& acts) const;

  // Gradient of sum_n loss_weight * token_losses[n], added into grads.
  void backward(const ParamTensors& params, const MicroBatch& batch, const Activations& acts, double loss_weight,
                ParamTensors& grads) const;

 private:
  AttentionShape attention_shape(int64_t windows) const;
  void attention_block_forward(const ParamTensors& params, const LayerParamIds& ids, const MicroBatch& batch,
                               LayerActivations& a, std::vector<double>& x) const;
  void attention_block_backward(const ParamTensors& params, const LayerParamIds& ids, const MicroBatch& batch,
                                const LayerActivations& a, std::vector<double>& dx, ParamTensors& grads) const;
  void mlp_block_forward(const ParamTensors& params, const LayerParamIds& ids, int64_t rows, LayerActivations& a,
                         std::vector<double>& x) const;
  void mlp_block_backward(const ParamTensors& params, const LayerParamIds& ids, int64_t rows,
                          const LayerActivations& a, std::vector<double>& dx, ParamTensors& grads) const;

  ModelConfig model_;
  bool document_masking_;
  const ParamTable& table_;
  Backend& backend_;
};

}  // namespace touchstone
