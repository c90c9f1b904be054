// The kernel interface: every operator the model calls, with tensor shapes next to every buffer.
//
// The model never loops over raw memory itself; it calls these operators. The CPU backend
// (kernels/cpu/) is the readable reference, written so each operator can be checked by eye against
// its formula; other backends implement the same interface and are tested against it.
//
// Conventions: buffers are row-major; N = rows = micro-batch windows x T; "_accum" outputs are added
// to (gradient accumulation), every other output is overwritten.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/rng.h"
#include "kernels/precision.h"

namespace touchstone {

// Shape of one attention call. Heads are laid out [windows, heads, T, D] (head-major), so each
// (window, head) slice is a contiguous [T, D] matrix.
struct AttentionShape {
  int64_t windows;       // b
  int64_t seq;           // T
  int64_t num_heads;     // NH
  int64_t num_kv_heads;  // NKV; query head h reads kv head h / (NH / NKV)
  int64_t head_dim;      // D
  double scale() const;  // 1 / sqrt(D)
};

// One dropout site of one micro-batch (docs/architecture.md "Dropout"). Element e of global sample k
// of the site is kept iff uniform_at(key, k, e) > probability; a kept element is scaled by
// 1 / (1 - probability) (inverted dropout). The ops below say which (k, e) each local element is.
struct DropoutSite {
  PhiloxKey key{};                          // stream_key(train.seed, site name)
  double probability = 0.0;                 // p in [0, 1)
  const int64_t* sample_indices = nullptr;  // [b] global sample index of each window
};

// The attention dropout of one call. Local element (w, h, i, j) of the mask is element
// ((first_head + h) * T + i) * T + j of sample site.sample_indices[w] (attention_dropout_element):
// tensor parallelism gives a rank the global heads [first_head, first_head + NHl). Probability 0 (the
// default) is no dropout.
struct AttentionDropout {
  DropoutSite site{};
  int64_t first_head = 0;
  bool active() const { return site.probability > 0.0; }
};

// Where the rows of one attention call sit in their windows, for a call over part of a window (context
// parallelism computes a rank's query chunks against one chunk of keys at a time, docs/parallelism.md).
// Query row i of window w is position query_positions[w*Tq + i] of that window, in document
// query_document_ids[w*Tq + i]; key row j is position key_positions[w*Tk + j], in document
// key_document_ids[w*Tk + j]. Causality and document masking compare these, and the attention dropout
// mask's element is keyed by the positions and window_seq (attention_dropout_element), so every entry a
// block computes is the entry the whole window's call computes. The whole-window call
// (Backend::attention_forward) is the block with Tk = Tq = T and positions 0..T-1 on both sides.
struct AttentionBlock {
  int64_t key_seq = 0;                          // Tk: key rows per window
  int64_t window_seq = 0;                       // T of the whole window
  const int32_t* query_positions = nullptr;     // [b*Tq]
  const int32_t* query_document_ids = nullptr;  // [b*Tq]
  const int32_t* key_positions = nullptr;       // [b*Tk]
  const int32_t* key_document_ids = nullptr;    // [b*Tk]
};

// (query tile, key tile) pairs of attention: computed, or skipped because causality or document masking
// hides every entry of the pair. The work grows with `computed`.
struct AttentionTileCount {
  int64_t computed = 0;
  int64_t skipped = 0;
};

struct AdamWStep {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;             // 1-based update number, for bias correction
  double grad_scale = 1.0;  // the update reads grad[i] * grad_scale (in double): the clip coefficient
};

// What a tensor is, for the rounding that storing it implies (docs/precision.md).
enum class TensorRole {
  kComputeWeight,  // the copy of the weights the passes use: BF16 in BF16 mode
  kActivation,     // activations and their gradients between operators: BF16 in BF16 mode
  kState,          // main gradients, master weights, Adam moments: FP32 unless FP64
};

struct BackendOptions {
  Precision precision = Precision::kFp64;
  // BF16 only: true adds each micro-batch's FP32 weight-gradient GEMM result straight into the FP32
  // main gradient (gradient-accumulation fusion); false first rounds it to BF16, as without fusion.
  bool grad_accumulation_fusion = true;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const BackendOptions& options() const = 0;

  // x[n] <- x stored as `role` in this backend's precision.
  virtual void round(TensorRole role, double* x, int64_t n) = 0;

  // y[N,out] = x[N,in] @ W[out,in]^T
  virtual void linear_forward(const double* x, const double* weight, int64_t rows, int64_t in, int64_t out,
                              double* y) = 0;
  // dx[N,in] = dy[N,out] @ W[out,in];  dW_accum[out,in] += dy^T @ x. Either output may be null, and
  // is then not computed: a split backward (ZB-H1) computes dx first and dW later, each with the same
  // calls, and so the same bits, as the whole backward.
  virtual void linear_backward(const double* dy, const double* x, const double* weight, int64_t rows,
                               int64_t in, int64_t out, double* dx, double* dweight_accum) = 0;

  // Vocab-parallel embedding lookup; this rank's table slice holds vocabulary ids
  // [vocab_start, vocab_start + vocab_local). y[N,H] = table[tokens[n] - vocab_start, :] when the token is
  // in the slice, 0 otherwise (the tp ranks' partial results sum to the full lookup).
  virtual void embedding_forward(const int32_t* tokens, const double* table, int64_t rows, int64_t hidden,
                                 int64_t vocab_start, int64_t vocab_local, double* y) = 0;
  // dtable_accum[tokens[n] - vocab_start, :] += dy[n, :] for the tokens in the slice
  virtual void embedding_backward(const int32_t* tokens, const double* dy, int64_t rows, int64_t hidden,
                                  int64_t vocab_start, int64_t vocab_local, double* dtable_accum) = 0;

  // y[N,H] = x / sqrt(mean(x^2) + eps) * w[H];  rstd[N] = 1 / sqrt(mean(x^2) + eps) saved for backward
  virtual void rmsnorm_forward(const double* x, const double* weight, int64_t rows, int64_t hidden,
                               double eps, double* y, double* rstd) = 0;
  // dx[N,H];  dw_accum[H] += sum_n dy * x * rstd
  virtual void rmsnorm_backward(const double* dy, const double* x, const double* weight, const double* rstd,
                                int64_t rows, int64_t hidden, double* dx, double* dweight_accum) = 0;

  // qkv[N, (NH + 2 NKV) D] in the grouped row order of linear_qkv (per KV group g: its NH/NKV query
  // heads, then key g, then value g) -> q[b,NH,T,D], k[b,NKV,T,D], v[b,NKV,T,D]
  virtual void qkv_split(const double* qkv, const AttentionShape& shape, double* q, double* k, double* v) = 0;
  // The inverse: dq, dk, dv -> dqkv[N, (NH + 2 NKV) D]
  virtual void qkv_merge(const double* dq, const double* dk, const double* dv, const AttentionShape& shape,
                         double* dqkv) = 0;

  // In-place rotate-half RoPE of x[b, heads, T, D] at position_ids[b*T]: pair (i, i + D/2) rotated by
  // angle pos * theta^(-2i/D). inverse = true rotates by -angle (the backward of the forward rotation).
  virtual void rope(double* x, const int32_t* position_ids, int64_t windows, int64_t heads, int64_t seq,
                    int64_t head_dim, double theta, bool inverse) = 0;

  // out[N, NH*D] = (softmax(q k^T * scale + mask) * keep) v, where query i may see key j iff j <= i and
  // (when document_masking) document_ids[i] == document_ids[j]; keep is the attention dropout mask, drawn
  // inside the kernel (AttentionDropout), never stored. lse[b,NH,T] = log sum_j visible exp(s_ij), the
  // log-sum-exp of each query row's scaled scores, is all the backward needs to recompute P: the
  // kernels work in tiles of queries and keys (flash attention), so memory is O(T) per head, and a
  // tile that the mask leaves empty is never computed (attention_tiles counts them).
  // The whole window: attention_block_forward with positions 0..T-1 for queries and keys.
  void attention_forward(const double* q, const double* k, const double* v, const int32_t* document_ids,
                         bool document_masking, const AttentionDropout& dropout, const AttentionShape& shape,
                         double* out, double* lse);
  // dout[N, NH*D] -> dq[b,NH,T,D], dk[b,NKV,T,D], dv[b,NKV,T,D] (overwritten), from the forward's
  // inputs, its output out[N, NH*D] and lse[b,NH,T]
  void attention_backward(const double* dout, const double* q, const double* k, const double* v,
                          const double* out, const double* lse, const int32_t* document_ids,
                          bool document_masking, const AttentionDropout& dropout, const AttentionShape& shape,
                          double* dq, double* dk, double* dv);

  // Attention of Tq = shape.seq query rows against Tk = block.key_seq key rows placed by `block`:
  // q[b,NH,Tq,D], k[b,NKV,Tk,D], v[b,NKV,Tk,D] -> out[b*Tq, NH*D], lse[b,NH,Tq], the rule and the
  // formulas of attention_forward over the keys of this block only. A query row that sees no key of
  // the block gets out = 0 and lse = -inf (so attention_merge leaves the other blocks' result as it is).
  virtual void attention_block_forward(const double* q, const double* k, const double* v,
                                       const AttentionBlock& block, bool document_masking,
                                       const AttentionDropout& dropout, const AttentionShape& shape,
                                       double* out, double* lse) = 0;
  // This block's share of the backward: dq[b,NH,Tq,D], dk[b,NKV,Tk,D], dv[b,NKV,Tk,D] (overwritten), from
  // dout[b*Tq, NH*D] and the output out[b*Tq, NH*D] and lse[b,NH,Tq] of the attention over all the keys
  // (every block merged): P = exp(S - lse) is then the whole softmax's, so the blocks' dq add up to
  // the whole dq and each block's dk, dv are its keys' whole gradients from these queries.
  virtual void attention_block_backward(const double* dout, const double* q, const double* k, const double* v,
                                        const double* out, const double* lse, const AttentionBlock& block,
                                        bool document_masking, const AttentionDropout& dropout,
                                        const AttentionShape& shape, double* dq, double* dk, double* dv) = 0;
  // Merges one block's attention into the running result of the blocks before it, rows [b*Tq]:
  //   lse' = log(exp(lse) + exp(block_lse)),  out' = exp(lse - lse') out + exp(block_lse - lse') block_out
  // (the log-sum-exp rule of flash attention across key blocks); a row at -inf on one side takes the
  // other side's values. out[b*Tq, NH*D], lse[b,NH,Tq] are updated in place.
  virtual void attention_merge(const double* block_out, const double* block_lse, const AttentionShape& shape,
                               double* out, double* lse) = 0;
  // The (query tile, key tile) pairs attention_forward has computed and skipped since construction.
  virtual AttentionTileCount attention_tiles() const = 0;

  // The hidden dropout mask: keep_scale = 1 / (1 - p) where kept (in FP32 unless FP64), 0 where dropped.
  // keep_scale[rows,H] for rows [first_row, first_row + rows) of the micro-batch's N = b*T rows (this rank's
  // block with sequence parallelism): global row w*T + i, column c is element i*H + c of sample
  // sample_indices[w].
  virtual void hidden_dropout_mask(const DropoutSite& site, int64_t first_row, int64_t rows, int64_t seq,
                                   int64_t hidden, double* keep_scale) = 0;
  // y[n] = x[n] * keep_scale[n], stored as an activation (y may be x)
  virtual void dropout_forward(const double* x, const double* keep_scale, int64_t n, double* y) = 0;
  // dx[n] = dy[n] * keep_scale[n]: the same mask and scale (dx may be dy)
  virtual void dropout_backward(const double* dy, const double* keep_scale, int64_t n, double* dx) = 0;

  // fc1[N, 2F] = [gate | up] -> act[N,F] = silu(gate) * up
  virtual void swiglu_forward(const double* fc1, int64_t rows, int64_t ffn, double* act) = 0;
  // dact[N,F] -> dfc1[N,2F], and act[N,F] again, the bits of swiglu_forward, for the fc2 weight gradient
  // (the backward computes sigmoid(gate) anyway). act may be dact itself: each element of dact is read
  // before that element of act is written.
  virtual void swiglu_backward(const double* dact, const double* fc1, int64_t rows, int64_t ffn, double* dfc1,
                               double* act) = 0;

  // Vocab-parallel cross entropy over this rank's logits slice [N, Vl] (vocabulary ids
  // [vocab_start, vocab_start + Vl)); Megatron's three reductions over the tp group sit between calls:
  //   logits_row_max          row_max[N] = max over the slice            -> all-reduce max
  //   cross_entropy_partials  sum_exp[N] = sum_j exp(logits - row_max),
  //                           target_logit[N] = the target's logit, 0 when not in the slice
  //                                                                       -> all-reduce sum (each)
  //   cross_entropy_loss      losses[N] = log(sum_exp) + row_max - target_logit, 0 where target = -100
  virtual void logits_row_max(const double* logits, int64_t rows, int64_t vocab_local, double* row_max) = 0;
  virtual void cross_entropy_partials(const double* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab_local, int64_t vocab_start, const double* row_max,
                                      double* sum_exp, double* target_logit) = 0;
  virtual void cross_entropy_loss(const double* row_max, const double* sum_exp, const double* target_logit,
                                  const int32_t* targets, int64_t rows, double* losses) = 0;
  // dlogits[N,Vl] = loss_weight * (exp(logits - row_max) / sum_exp - onehot(target)); 0 rows where ignored.
  // dlogits may be logits itself (the head overwrites the logits): each element is read before it is
  // written, and from nothing but its own logit and its row's statistics.
  virtual void cross_entropy_backward(const double* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab_local, int64_t vocab_start, const double* row_max,
                                      const double* sum_exp, double loss_weight, double* dlogits) = 0;

  // x[n] += y[n]
  virtual void add_inplace(double* x, const double* y, int64_t n) = 0;

  // AdamW with bias correction, PyTorch's form, on n elements (decay only if weight_decay != 0).
  virtual void adamw_update(double* param, const double* grad, double* exp_avg, double* exp_avg_sq, int64_t n,
                            const AdamWStep& step) = 0;
};

// The embedded default: plain C++ with OpenBLAS for the GEMMs.
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options = {});

// The kernels a run computes with: the CPU reference, or the CUDA backend (kernels/cuda/, docs/cuda.md).
enum class BackendKind { kCpu, kCuda };
std::string backend_kind_name(BackendKind kind);  // "cpu" or "cuda"

// The backend of `kind`; the CUDA backend on GPU local_rank % (visible GPUs). Throws InputError for a
// build without the CUDA backend or a machine without a usable GPU.
std::unique_ptr<Backend> make_backend(BackendKind kind, const BackendOptions& options, int local_rank = 0);
// Throws the InputError make_backend would throw, without making a backend (the up-front check).
void check_backend_available(BackendKind kind);
// Throws InputError saying why unless this build has the CUDA backend and a GPU is usable: the one
// wording of both causes, for the CUDA backend and for NCCL communication. The message names no
// option; a command line that knows which flag asked for CUDA puts that flag in front.
void require_cuda_device();
// What the golden file records about the kernels: "cpu", or "cuda (<GPU name>)" for the GPU that
// make_backend(kind, options, local_rank) drives.
std::string backend_description(BackendKind kind, int local_rank);

}  // namespace touchstone
