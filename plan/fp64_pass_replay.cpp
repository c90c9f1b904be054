// Allocation replay of one micro-batch's forward and backward (model/transformer.cpp).
//
// Each function below mirrors one function of the model and allocates, in the same order, the buffers
// it allocates (std::vector<double>: 8 bytes per element); buffers local to a function are freed when
// it returns, stored activations when the executor drops the micro-batch's Activations.
#include "plan/fp64_pass_replay.h"

#include <string>

#include "kernels/cpu/cpu_backend.h"

namespace touchstone::plan {

Dims dims_of(const Fp64Rank& r) {
  const auto t = static_cast<double>(r.tp);
  const ModelShape& m = r.shape;
  const double N = static_cast<double>(r.micro_batch * m.seq);
  const AttentionShape attention{r.micro_batch, m.seq, m.heads / r.tp, m.kv_heads / r.tp, m.head_dim()};
  return Dims{N,
              r.sequence_parallel ? N / t : N,
              static_cast<double>(m.hidden),
              static_cast<double>(m.head_dim()),
              static_cast<double>(m.heads) / t,
              static_cast<double>(m.kv_heads) / t,
              static_cast<double>(m.ffn) / t,
              static_cast<double>(m.vocab) / t,
              static_cast<double>(r.micro_batch),
              static_cast<double>(m.seq),
              r.sequence_parallel,
              static_cast<double>(CpuBackend::attention_forward_scratch(attention)),
              static_cast<double>(CpuBackend::attention_backward_scratch(attention))};
}

// A stored activation: kept in `stored`, and named in `names` for the breakdown when asked.
struct PassReplay::Keeper {
  BufferTally& l;
  std::vector<int>& stored;
  std::vector<NamedBytes>* names;
  int keep(double elements, const std::string& what) {
    const int h = l.alloc(elements, what, BufferKind::kStored);
    stored.push_back(h);
    if (names) names->push_back({what, l.bytes(h)});
    return h;
  }
};

// TensorParallelRegion::gather: a copy of the local rows (plain TP), or the full rows (SP); the
// all-gather receives into that buffer, with no scratch.
int PassReplay::gather(const std::string& what) { return l_.alloc(d_.N * d_.H, what); }

// TensorParallelRegion::reduce: the all-reduce sums the partial sums in place, through the group's
// scratch, and they move into the result (plain TP); or a new buffer of the local rows receives the
// reduce-scatter while the partial sums stay alive (SP).
int PassReplay::reduce(int partial, const std::string& what) {
  if (!d_.sp) {
    tp_.all_reduce_sum(d_.N * d_.H);
    return partial;
  }
  const int local = l_.alloc(d_.Nl * d_.H, what);
  tp_.reduce_scatter_sum(d_.Nl * d_.H);
  return local;
}

void PassReplay::attention_forward(Keeper k) {
  k.keep(d_.Nl * d_.H, "x_in");
  k.keep(d_.Nl, "rstd_attn");
  const int h_local = l_.alloc(d_.Nl * d_.H, "h_local");
  k.keep(d_.N * d_.H, "h_attn");  // gather of h_local
  const int qkv = l_.alloc(d_.N * (d_.heads + 2 * d_.kv_heads) * d_.D, "qkv");
  k.keep(d_.N * d_.heads * d_.D, "q");
  k.keep(d_.N * d_.kv_heads * d_.D, "k");
  k.keep(d_.N * d_.kv_heads * d_.D, "v");
  k.keep(d_.windows * d_.heads * d_.T, "lse");
  k.keep(d_.N * d_.heads * d_.D, "attn");
  l_.release(l_.alloc(threads_ * d_.attention_forward_scratch, "attention tiles (per kernel thread)"));
  const int proj_partial = l_.alloc(d_.N * d_.H, "proj_partial");
  const int proj = reduce(proj_partial, "proj");
  if (r_.hidden_dropout) k.keep(d_.Nl * d_.H, "hidden_attn_keep (dropout mask)");
  l_.release({h_local, qkv, proj_partial, proj});
}

void PassReplay::mlp_forward(Keeper k) {
  k.keep(d_.Nl * d_.H, "x_mid");
  k.keep(d_.Nl, "rstd_mlp");
  const int h_local = l_.alloc(d_.Nl * d_.H, "h_local");
  k.keep(d_.N * d_.H, "h_mlp");
  k.keep(d_.N * 2 * d_.ffn, "fc1");
  k.keep(d_.N * d_.ffn, "act");
  const int out_partial = l_.alloc(d_.N * d_.H, "out_partial");
  const int out = reduce(out_partial, "out");
  if (r_.hidden_dropout) k.keep(d_.Nl * d_.H, "hidden_mlp_keep (dropout mask)");
  l_.release({h_local, out_partial, out});
}

void PassReplay::head_forward(Keeper k) {
  k.keep(d_.Nl, "rstd_final");
  const int h_local = l_.alloc(d_.Nl * d_.H, "h_local");
  k.keep(d_.N * d_.H, "h_final");
  k.keep(d_.N * d_.vocab, "logits");
  k.keep(d_.N, "row_max");
  k.keep(d_.N, "sum_exp");
  const int target_logit = l_.alloc(d_.N, "target_logit");
  // The row maxima go through MPI_Allreduce directly; the two sums through the scratch.
  tp_.all_reduce_sum(d_.N);
  tp_.all_reduce_sum(d_.N);
  k.keep(d_.N, "token_losses");
  l_.release({h_local, target_logit});
}

std::vector<int> PassReplay::forward(Fp64StepReplay* breakdown) {
  const bool first_stage = r_.stage == 0, last_stage = r_.stage == r_.pp - 1;
  std::vector<int> stored;
  int x = 0;
  if (first_stage) {
    const int partial = l_.alloc(d_.N * d_.H, "embedding partial");
    x = reduce(partial, "x");
    if (x != partial) l_.release(partial);
  } else {
    x = l_.alloc(d_.Nl * d_.H, "x (copy of the received input)");
  }
  l_.store(x);  // the residual stream becomes x_final
  stored.push_back(x);
  for (int64_t layer = 0; layer < r_.layers; ++layer) {
    l_.at("forward, layer " + std::to_string(r_.first_layer + layer));
    std::vector<NamedBytes>* names = breakdown && layer == 0 ? &breakdown->stored_per_layer : nullptr;
    attention_forward(Keeper{l_, stored, names});
    mlp_forward(Keeper{l_, stored, names});
  }
  if (breakdown) breakdown->stored_head.push_back({"x_final", l_.bytes(x)});
  if (last_stage) {
    l_.at("forward, head");
    head_forward(Keeper{l_, stored, breakdown ? &breakdown->stored_head : nullptr});
  }
  return stored;
}

// The hidden dropout's backward writes the masked gradient into a scratch buffer of the local rows,
// alive until the block's backward returns.
std::vector<int> PassReplay::hidden_dropout_scratch() {
  if (!r_.hidden_dropout) return {};
  return {l_.alloc(d_.Nl * d_.H, "hidden dropout backward scratch")};
}

void PassReplay::attention_backward() {
  const std::vector<int> scratch = hidden_dropout_scratch();
  const int dproj = gather("dproj");
  const int dattn = l_.alloc(d_.N * d_.heads * d_.D, "dattn");
  const int dq = l_.alloc(d_.N * d_.heads * d_.D, "dq"), dk = l_.alloc(d_.N * d_.kv_heads * d_.D, "dk"),
            dv = l_.alloc(d_.N * d_.kv_heads * d_.D, "dv");
  l_.release(l_.alloc(threads_ * d_.attention_backward_scratch, "attention tiles (per kernel thread)"));
  const int dqkv = l_.alloc(d_.N * (d_.heads + 2 * d_.kv_heads) * d_.D, "dqkv");
  const int dh_partial = l_.alloc(d_.N * d_.H, "dh_partial"), dnorm_in = l_.alloc(d_.Nl * d_.H, "dnorm_in");
  const int dh = reduce(dh_partial, "dh");
  l_.release({dproj, dattn, dq, dk, dv, dqkv, dh_partial, dnorm_in, dh});
  l_.release(scratch);
}

void PassReplay::mlp_backward() {
  const std::vector<int> scratch = hidden_dropout_scratch();
  const int dout = gather("dout");
  const int dact = l_.alloc(d_.N * d_.ffn, "dact"), dfc1 = l_.alloc(d_.N * 2 * d_.ffn, "dfc1");
  const int dh_partial = l_.alloc(d_.N * d_.H, "dh_partial"), dnorm_in = l_.alloc(d_.Nl * d_.H, "dnorm_in");
  const int dh = reduce(dh_partial, "dh");
  l_.release({dout, dact, dfc1, dh_partial, dnorm_in, dh});
  l_.release(scratch);
}

int PassReplay::backward() {
  const bool first_stage = r_.stage == 0, last_stage = r_.stage == r_.pp - 1;
  int dx = 0;
  if (last_stage) {
    l_.at("backward, head");
    const int dlogits = l_.alloc(d_.N * d_.vocab, "dlogits"),
              dh_partial = l_.alloc(d_.N * d_.H, "dh_partial");
    const int dh = reduce(dh_partial, "dh");
    dx = l_.alloc(d_.Nl * d_.H, "dx");
    l_.release({dlogits, dh_partial, dh});
  } else {
    dx = l_.alloc(d_.Nl * d_.H, "dx (copy of the received gradient)");
  }
  for (int64_t layer = r_.layers - 1; layer >= 0; --layer) {
    l_.at("backward, layer " + std::to_string(r_.first_layer + layer));
    mlp_backward();
    attention_backward();
  }
  if (!first_stage) return dx;
  l_.at("backward, embedding");
  l_.release(gather("dfull"));
  l_.release(dx);
  return -1;
}

}  // namespace touchstone::plan
