// Allocation replay of one training step of Touchstone's FP64 trainer on one rank.
//
// Each function below mirrors one function of the trainer and allocates, in the same order, the
// buffers it allocates (std::vector<double>: 8 bytes per element); buffers local to a function are
// freed when it returns, stored activations when the executor drops the micro-batch's Activations.
// Shapes on a rank: N = b*T rows, Nl = N/tp with sequence parallelism (else N), and this rank's heads,
// KV heads, ffn columns and vocabulary rows (each / tp).
#include "tools/plan/fp64_trainer_memory.h"

#include <algorithm>
#include <cmath>

namespace touchstone::plan {

namespace {

constexpr double kBytes = 8.0;  // FP64

// Live bytes of the replayed allocations, and the largest total with where it happened.
class Ledger {
 public:
  int alloc(double elements, const std::string& what) {
    sizes_.push_back(elements * kBytes);
    live_ += sizes_.back();
    if (live_ > peak_.bytes) peak_ = {context_ + where_ + ": " + what, live_};
    return static_cast<int>(sizes_.size()) - 1;
  }
  void release(int handle) {
    live_ -= sizes_[static_cast<size_t>(handle)];
    sizes_[static_cast<size_t>(handle)] = 0;  // releasing twice (a moved-from buffer) frees nothing
  }
  void release(const std::vector<int>& handles) {
    for (int h : handles) release(h);
  }
  double bytes(int handle) const { return sizes_[static_cast<size_t>(handle)]; }
  double live() const { return live_; }
  // Where allocations happen: the micro-batch (or step phase), then the part of the model.
  void context(const std::string& context) { context_ = context.empty() ? "" : context + ", "; }
  void at(std::string where) { where_ = std::move(where); }
  const NamedBytes& peak() const { return peak_; }

 private:
  std::vector<double> sizes_;
  double live_ = 0;
  NamedBytes peak_;
  std::string context_, where_;
};

struct Dims {
  double N, Nl, H, D, heads, kv_heads, ffn, vocab, windows, T;
  bool sp;
};

Dims dims_of(const Fp64Rank& r) {
  const auto t = static_cast<double>(r.tp);
  const ModelShape& m = r.shape;
  const double N = static_cast<double>(r.micro_batch * m.seq);
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
              r.sequence_parallel};
}

// TensorParallelRegion::gather: a copy of the local rows (plain TP), or the full rows (SP).
int gather(Ledger& l, const Dims& d, const std::string& what) { return l.alloc(d.N * d.H, what); }

// TensorParallelRegion::reduce: the partial sums move into the result (plain TP), or a new buffer of
// the local rows receives the reduce-scatter while the partial sums stay alive (SP).
int reduce(Ledger& l, const Dims& d, int partial, const std::string& what) {
  return d.sp ? l.alloc(d.Nl * d.H, what) : partial;
}

// A stored activation: kept in `stored`, and named in `names` for the breakdown when asked.
struct Keeper {
  Ledger& l;
  std::vector<int>& stored;
  std::vector<NamedBytes>* names;
  int keep(double elements, const std::string& what) {
    const int h = l.alloc(elements, what);
    stored.push_back(h);
    if (names) names->push_back({what, l.bytes(h)});
    return h;
  }
};

void attention_forward(Ledger& l, const Dims& d, Keeper k) {
  k.keep(d.Nl * d.H, "x_in");
  k.keep(d.Nl, "rstd_attn");
  const int h_local = l.alloc(d.Nl * d.H, "h_local");
  k.keep(d.N * d.H, "h_attn");  // gather of h_local
  const int qkv = l.alloc(d.N * (d.heads + 2 * d.kv_heads) * d.D, "qkv");
  k.keep(d.N * d.heads * d.D, "q");
  k.keep(d.N * d.kv_heads * d.D, "k");
  k.keep(d.N * d.kv_heads * d.D, "v");
  k.keep(d.windows * d.heads * d.T * d.T, "probs");
  k.keep(d.N * d.heads * d.D, "attn");
  l.release(l.alloc(d.T, "softmax row (inside the attention kernel)"));
  const int proj_partial = l.alloc(d.N * d.H, "proj_partial");
  const int proj = reduce(l, d, proj_partial, "proj");
  l.release({h_local, qkv, proj_partial, proj});
}

void mlp_forward(Ledger& l, const Dims& d, Keeper k) {
  k.keep(d.Nl * d.H, "x_mid");
  k.keep(d.Nl, "rstd_mlp");
  const int h_local = l.alloc(d.Nl * d.H, "h_local");
  k.keep(d.N * d.H, "h_mlp");
  k.keep(d.N * 2 * d.ffn, "fc1");
  k.keep(d.N * d.ffn, "act");
  const int out_partial = l.alloc(d.N * d.H, "out_partial");
  const int out = reduce(l, d, out_partial, "out");
  l.release({h_local, out_partial, out});
}

void head_forward(Ledger& l, const Dims& d, Keeper k) {
  k.keep(d.Nl, "rstd_final");
  const int h_local = l.alloc(d.Nl * d.H, "h_local");
  k.keep(d.N * d.H, "h_final");
  k.keep(d.N * d.vocab, "logits");
  k.keep(d.N, "row_max");
  k.keep(d.N, "sum_exp");
  const int target_logit = l.alloc(d.N, "target_logit");
  k.keep(d.N, "token_losses");
  l.release({h_local, target_logit});
}

// Transformer::forward of one micro-batch; returns the handles its Activations hold.
std::vector<int> forward(Ledger& l, const Dims& d, const Fp64Rank& r, bool first_stage, bool last_stage,
                         Fp64StepReplay* breakdown) {
  std::vector<int> stored;
  int x = 0;
  if (first_stage) {
    const int partial = l.alloc(d.N * d.H, "embedding partial");
    x = reduce(l, d, partial, "x");
    if (x != partial) l.release(partial);
  } else {
    x = l.alloc(d.Nl * d.H, "x (copy of the received input)");
  }
  stored.push_back(x);  // the residual stream becomes x_final
  for (int64_t layer = 0; layer < r.layers; ++layer) {
    l.at("forward, layer " + std::to_string(r.first_layer + layer));
    std::vector<NamedBytes>* names = breakdown && layer == 0 ? &breakdown->stored_per_layer : nullptr;
    attention_forward(l, d, Keeper{l, stored, names});
    mlp_forward(l, d, Keeper{l, stored, names});
  }
  if (breakdown) breakdown->stored_head.push_back({"x_final", l.bytes(x)});
  if (last_stage) {
    l.at("forward, head");
    head_forward(l, d, Keeper{l, stored, breakdown ? &breakdown->stored_head : nullptr});
  }
  return stored;
}

void attention_backward(Ledger& l, const Dims& d) {
  const int dproj = gather(l, d, "dproj");
  const int dattn = l.alloc(d.N * d.heads * d.D, "dattn");
  const int dq = l.alloc(d.N * d.heads * d.D, "dq"), dk = l.alloc(d.N * d.kv_heads * d.D, "dk"),
            dv = l.alloc(d.N * d.kv_heads * d.D, "dv");
  l.release(l.alloc(d.T * d.T, "dscores (inside the attention kernel)"));
  const int dqkv = l.alloc(d.N * (d.heads + 2 * d.kv_heads) * d.D, "dqkv");
  const int dh_partial = l.alloc(d.N * d.H, "dh_partial"), dnorm_in = l.alloc(d.Nl * d.H, "dnorm_in");
  const int dh = reduce(l, d, dh_partial, "dh");
  l.release({dproj, dattn, dq, dk, dv, dqkv, dh_partial, dnorm_in, dh});
}

void mlp_backward(Ledger& l, const Dims& d) {
  const int dout = gather(l, d, "dout");
  const int dact = l.alloc(d.N * d.ffn, "dact"), dfc1 = l.alloc(d.N * 2 * d.ffn, "dfc1");
  const int dh_partial = l.alloc(d.N * d.H, "dh_partial"), dnorm_in = l.alloc(d.Nl * d.H, "dnorm_in");
  const int dh = reduce(l, d, dh_partial, "dh");
  l.release({dout, dact, dfc1, dh_partial, dnorm_in, dh});
}

// Transformer::backward of one micro-batch; returns the handle of the input gradient it hands to the
// executor (-1 on the first stage).
int backward(Ledger& l, const Dims& d, const Fp64Rank& r, bool first_stage, bool last_stage) {
  int dx = 0;
  if (last_stage) {
    l.at("backward, head");
    const int dlogits = l.alloc(d.N * d.vocab, "dlogits"), dh_partial = l.alloc(d.N * d.H, "dh_partial");
    const int dh = reduce(l, d, dh_partial, "dh");
    dx = l.alloc(d.Nl * d.H, "dx");
    l.release({dlogits, dh_partial, dh});
  } else {
    dx = l.alloc(d.Nl * d.H, "dx (copy of the received gradient)");
  }
  for (int64_t layer = r.layers - 1; layer >= 0; --layer) {
    l.at("backward, layer " + std::to_string(r.first_layer + layer));
    mlp_backward(l, d);
    attention_backward(l, d);
  }
  if (!first_stage) return dx;
  l.at("backward, embedding");
  l.release(gather(l, d, "dfull"));
  l.release(dx);
  return -1;
}

// Largest parameter tensor this rank holds, in elements (AdamW's scaled copy of its gradient).
double largest_tensor(const Fp64Rank& r, bool first_stage, bool last_stage) {
  const ModelShape& m = r.shape;
  const auto t = static_cast<double>(r.tp), h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn);
  const auto a = static_cast<double>(m.heads), k = static_cast<double>(m.kv_heads),
             dh = static_cast<double>(m.head_dim());
  double largest = std::max({(a + 2 * k) * dh * h, a * dh * h, 2 * f * h, f * h}) / t;
  if (first_stage || last_stage) largest = std::max(largest, static_cast<double>(m.vocab) * h / t);
  return largest;
}

}  // namespace

Fp64StepReplay replay_fp64_step(const Fp64Rank& r) {
  Fp64StepReplay replay;
  const Dims d = dims_of(r);
  const bool first_stage = r.stage == 0, last_stage = r.stage == r.pp - 1;
  Ledger l;
  // oracle/train_step.cpp: in FP64 the passes read the weights themselves (only BF16 makes a copy).
  l.at("step start");
  // parallel/pipeline/executor.cpp, 1F1B: w warm-up forwards, then forward/backward pairs, then w
  // backwards. Received inputs live through their forward; received gradients through their backward;
  // input gradients until the step's sends complete; the last stage copies each micro-batch's token
  // losses into the result.
  const int64_t m = r.micro_batches, warm = std::min(r.pp - r.stage - 1, m);
  std::vector<std::vector<int>> acts(static_cast<size_t>(m));
  std::vector<int> d_inputs, token_records;
  const auto run_forward = [&](int64_t j) {
    l.context("micro-batch " + std::to_string(j));
    l.at("forward");
    const int input = first_stage ? -1 : l.alloc(d.Nl * d.H, "received activation");
    const double before = l.live();
    acts[static_cast<size_t>(j)] = forward(l, d, r, first_stage, last_stage, j == 0 ? &replay : nullptr);
    if (j == 0) replay.stored_per_micro_batch = l.live() - before;
    if (input >= 0) l.release(input);
    if (last_stage) token_records.push_back(l.alloc(d.N, "token-loss record"));
  };
  const auto run_backward = [&](int64_t j) {
    l.context("micro-batch " + std::to_string(j));
    l.at("backward");
    const int d_output = last_stage ? -1 : l.alloc(d.Nl * d.H, "received gradient");
    const int d_input = backward(l, d, r, first_stage, last_stage);
    l.release(acts[static_cast<size_t>(j)]);
    if (d_output >= 0) l.release(d_output);
    if (d_input >= 0) d_inputs.push_back(d_input);
  };
  for (int64_t j = 0; j < warm; ++j) run_forward(j);
  for (int64_t j = 0; j < m - warm; ++j) {
    run_forward(warm + j);
    run_backward(j);
  }
  for (int64_t j = m - warm; j < m; ++j) run_backward(j);
  l.release(d_inputs);

  // oracle/train_step.cpp: world rank 0 (stage 0) assembles every token loss of the global batch;
  // the last stage's tp rank 0 concatenates its own first.
  l.context("");
  l.at("token-loss gather");
  const double local_tokens = static_cast<double>(m) * d.N,
               global_tokens = local_tokens * static_cast<double>(r.dp);
  std::vector<int> gather_buffers;
  int all = -1;
  if (r.collect_outputs) {
    if (last_stage) gather_buffers.push_back(l.alloc(local_tokens, "token losses of this rank"));
    if (first_stage) {
      all = l.alloc(global_tokens, "token losses of the global batch");
      l.release(l.alloc(local_tokens, "token losses of one dp rank"));
    }
  }
  l.release(gather_buffers);

  // parallel/data/data_parallel_optimizer.cpp: the flat gradient (padded to a multiple of dp), then
  // either AdamW per tensor on a scaled copy of its gradient, or (distributed) the reduce-scattered
  // chunk, the flat parameters, the all-gathered parameters and the all-gathered gradient.
  l.at("optimizer update");
  const auto dp = static_cast<double>(r.dp);
  const double flat = std::ceil(r.params / dp) * dp, chunk = flat / dp;
  std::vector<int> update{l.alloc(flat, "flat gradient")};
  if (!r.distributed_optimizer) {
    l.release(l.alloc(largest_tensor(r, first_stage, last_stage), "scaled gradient of the largest tensor"));
  } else {
    update.push_back(l.alloc(chunk, "gradient chunk"));
    update.push_back(l.alloc(flat, "flat parameters"));
    l.release(l.alloc(std::min(chunk, largest_tensor(r, first_stage, last_stage)), "scaled gradient"));
    update.push_back(l.alloc(flat, "gathered parameters"));
    if (r.collect_outputs) update.push_back(l.alloc(flat, "gathered gradient"));
  }
  l.release(update);
  if (all >= 0) l.release(all);
  l.release(token_records);
  replay.peak = l.peak();
  return replay;
}

MemoryPlanInput plan_input_from_config(const Config& c) {
  MemoryPlanInput in;
  const ModelConfig& m = c.model;
  in.shape = ModelShape{m.num_layers,      m.hidden_size, m.num_heads,  m.num_kv_heads,
                        m.ffn_hidden_size, m.vocab_size,  m.seq_length, m.tie_embeddings};
  in.recipe = find_recipe("fp64");
  in.distributed_optimizer = c.parallel.distributed_optimizer;
  in.tp = c.parallel.tp;
  in.pp = c.parallel.pp;
  in.dps = {c.parallel.dp};
  in.stage_layers = c.parallel.stage_layers;
  in.micro_batch = c.train.micro_batch_size;
  in.global_batch = c.train.global_batch_size;
  in.sequence_parallel = c.parallel.sequence_parallel;
  in.activations = ActivationModel::kTouchstoneFp64;
  in.trainer_precision = c.precision;
  return in;
}

StepPeakPrediction predict_single_process_step(const Config& config) {
  MemoryPlanInput in = plan_input_from_config(config);
  in.tp = in.pp = 1;
  in.dps = {1};
  in.stage_layers.clear();
  validate(in);
  StepPeakPrediction prediction;
  prediction.stage = plan_layout(in, 1).stages.front();
  prediction.state = prediction.stage.state;
  prediction.total = prediction.stage.total();
  return prediction;
}

}  // namespace touchstone::plan
