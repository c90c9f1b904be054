// The CPU reference backend, FP64. Each operator's body lives in the file named next to it.
#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/rounding.h"

namespace touchstone {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options) : options_(options), rounding_{options.precision} {}
  std::string name() const override { return "cpu"; }
  const BackendOptions& options() const override { return options_; }
  void round(TensorRole role, double* x, int64_t n) override;

  // kernels/cpu/linear.cpp
  void linear_forward(const double* x, const double* weight, int64_t rows, int64_t in, int64_t out,
                      double* y) override;
  void linear_backward(const double* dy, const double* x, const double* weight, int64_t rows, int64_t in,
                       int64_t out, double* dx, double* dweight_accum) override;
  void embedding_forward(const int32_t* tokens, const double* table, int64_t rows, int64_t hidden,
                         int64_t vocab_start, int64_t vocab_local, double* y) override;
  void embedding_backward(const int32_t* tokens, const double* dy, int64_t rows, int64_t hidden,
                          int64_t vocab_start, int64_t vocab_local, double* dtable_accum) override;
  void add_inplace(double* x, const double* y, int64_t n) override;

  // kernels/cpu/normalization.cpp (RMSNorm, RoPE, SwiGLU, the qkv layout)
  void rmsnorm_forward(const double* x, const double* weight, int64_t rows, int64_t hidden, double eps,
                       double* y, double* rstd) override;
  void rmsnorm_backward(const double* dy, const double* x, const double* weight, const double* rstd,
                        int64_t rows, int64_t hidden, double* dx, double* dweight_accum) override;
  void qkv_split(const double* qkv, const AttentionShape& shape, double* q, double* k, double* v) override;
  void qkv_merge(const double* dq, const double* dk, const double* dv, const AttentionShape& shape,
                 double* dqkv) override;
  void rope(double* x, const int32_t* position_ids, int64_t windows, int64_t heads, int64_t seq,
            int64_t head_dim, double theta, bool inverse) override;
  void swiglu_forward(const double* fc1, int64_t rows, int64_t ffn, double* act) override;
  void swiglu_backward(const double* dact, const double* fc1, int64_t rows, int64_t ffn, double* dfc1,
                       double* act) override;

  // kernels/cpu/attention.cpp
  void attention_block_forward(const double* q, const double* k, const double* v, const AttentionBlock& block,
                               bool document_masking, const AttentionDropout& dropout,
                               const AttentionShape& shape, double* out, double* lse) override;
  void attention_block_backward(const double* dout, const double* q, const double* k, const double* v,
                                const double* out, const double* lse, const AttentionBlock& block,
                                bool document_masking, const AttentionDropout& dropout,
                                const AttentionShape& shape, double* dq, double* dk, double* dv) override;
  // kernels/cpu/attention_merge.cpp
  void attention_merge(const double* block_out, const double* block_lse, const AttentionShape& shape,
                       double* out, double* lse) override;
  AttentionTileCount attention_tiles() const override { return tiles_; }
  // Doubles of scratch each kernel thread holds during attention_block_forward / _backward.
  static int64_t attention_forward_scratch(const AttentionShape& shape);
  static int64_t attention_backward_scratch(const AttentionShape& shape);

  // kernels/cpu/dropout.cpp
  void hidden_dropout_mask(const DropoutSite& site, int64_t first_row, int64_t rows, int64_t seq,
                           int64_t hidden, double* keep_scale) override;
  void dropout_forward(const double* x, const double* keep_scale, int64_t n, double* y) override;
  void dropout_backward(const double* dy, const double* keep_scale, int64_t n, double* dx) override;

  // kernels/cpu/loss_and_optimizer.cpp
  void logits_row_max(const double* logits, int64_t rows, int64_t vocab_local, double* row_max) override;
  void cross_entropy_partials(const double* logits, const int32_t* targets, int64_t rows, int64_t vocab_local,
                              int64_t vocab_start, const double* row_max, double* sum_exp,
                              double* target_logit) override;
  void cross_entropy_loss(const double* row_max, const double* sum_exp, const double* target_logit,
                          const int32_t* targets, int64_t rows, double* losses) override;
  void cross_entropy_backward(const double* logits, const int32_t* targets, int64_t rows, int64_t vocab_local,
                              int64_t vocab_start, const double* row_max, const double* sum_exp,
                              double loss_weight, double* dlogits) override;
  void adamw_update(double* param, const double* grad, double* exp_avg, double* exp_avg_sq, int64_t n,
                    const AdamWStep& step) override;

 protected:
  // How the scores are masked. kMasked: query i sees key j iff the rule of attention_forward allows it,
  // and tiles the rule leaves empty are skipped. kAllowedAdded: every key of the window is seen and 1 is
  // added to the scores the rule allows (oracle/diff/added_mask.h: a 0/1 mask passed where an additive
  // one was expected); no tile is skipped.
  enum class MaskForm { kMasked, kAllowedAdded };
  virtual MaskForm mask_form() const { return MaskForm::kMasked; }

 private:
  Precision precision() const { return options_.precision; }
  BackendOptions options_;
  cpu::Rounding rounding_;
  AttentionTileCount tiles_;  // attention_forward's, summed over calls
};

}  // namespace touchstone
