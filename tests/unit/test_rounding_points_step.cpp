// The rounding points of docs/precision.md in a whole BF16 training step: a backend that forwards to
// the CPU backend checks every buffer the model hands it and gets back. The weights the passes use
// are the BF16 copy of the FP32 master weights (Trainer::step), every activation and activation
// gradient between operators is BF16, softmax probabilities, norm statistics and cross-entropy
// partials are FP32, and main gradients, master weights and Adam moments are FP32 (fusion on and off;
// attention and hidden dropout on). The values of each operator are checked against references in
// test_rounding_points.cpp; this test shows that the model calls them with the formats they assume
// and that the step makes the compute-weight copy. Exact: a value is in a format or it is not.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/params.h"
#include "oracle/train_step.h"
#include "test_rounding_reference.h"
#include "test_support.h"

namespace touchstone {
namespace {

enum class Format { kFp32, kBf16 };

// Forwards every operator to the CPU backend and counts, per "operator buffer", the elements checked
// and those not stored in the format docs/precision.md names.
class FormatCheckingBackend final : public Backend {
 public:
  explicit FormatCheckingBackend(const BackendOptions& options) : inner_(make_cpu_backend(options)) {}
  std::string name() const override { return "format-checking cpu"; }
  const BackendOptions& options() const override { return inner_->options(); }

  struct Tally {
    int64_t checked = 0, wrong = 0;
  };
  const std::map<std::string, Tally>& tallies() const { return tallies_; }

  void round(TensorRole role, double* x, int64_t n) override { inner_->round(role, x, n); }

  void linear_forward(const double* x, const double* weight, int64_t rows, int64_t in, int64_t out,
                      double* y) override {
    check("linear_forward weight", Format::kBf16, weight, out * in);
    check("linear_forward x", Format::kBf16, x, rows * in);
    inner_->linear_forward(x, weight, rows, in, out, y);
    check("linear_forward y", Format::kBf16, y, rows * out);
  }
  void linear_backward(const double* dy, const double* x, const double* weight, int64_t rows, int64_t in,
                       int64_t out, double* dx, double* dweight_accum) override {
    check("linear_backward weight", Format::kBf16, weight, out * in);
    check("linear_backward dy", Format::kBf16, dy, rows * out);
    inner_->linear_backward(dy, x, weight, rows, in, out, dx, dweight_accum);
    check("linear_backward dx", Format::kBf16, dx, rows * in);
    check("linear_backward dW main grad", Format::kFp32, dweight_accum, out * in);
  }
  void embedding_forward(const int32_t* tokens, const double* table, int64_t rows, int64_t hidden,
                         int64_t vocab_start, int64_t vocab_local, double* y) override {
    check("embedding_forward table", Format::kBf16, table, vocab_local * hidden);
    inner_->embedding_forward(tokens, table, rows, hidden, vocab_start, vocab_local, y);
    check("embedding_forward y", Format::kBf16, y, rows * hidden);
  }
  void embedding_backward(const int32_t* tokens, const double* dy, int64_t rows, int64_t hidden,
                          int64_t vocab_start, int64_t vocab_local, double* dtable_accum) override {
    check("embedding_backward dy", Format::kBf16, dy, rows * hidden);
    inner_->embedding_backward(tokens, dy, rows, hidden, vocab_start, vocab_local, dtable_accum);
    check("embedding_backward dtable main grad", Format::kFp32, dtable_accum, vocab_local * hidden);
  }
  void rmsnorm_forward(const double* x, const double* weight, int64_t rows, int64_t hidden, double eps,
                       double* y, double* rstd) override {
    check("rmsnorm_forward weight", Format::kBf16, weight, hidden);
    check("rmsnorm_forward x", Format::kBf16, x, rows * hidden);
    inner_->rmsnorm_forward(x, weight, rows, hidden, eps, y, rstd);
    check("rmsnorm_forward y", Format::kBf16, y, rows * hidden);
    check("rmsnorm_forward rstd", Format::kFp32, rstd, rows);
  }
  void rmsnorm_backward(const double* dy, const double* x, const double* weight, const double* rstd,
                        int64_t rows, int64_t hidden, double* dx, double* dweight_accum) override {
    check("rmsnorm_backward dy", Format::kBf16, dy, rows * hidden);
    inner_->rmsnorm_backward(dy, x, weight, rstd, rows, hidden, dx, dweight_accum);
    check("rmsnorm_backward dx", Format::kBf16, dx, rows * hidden);
    check("rmsnorm_backward dw main grad", Format::kFp32, dweight_accum, hidden);
  }
  void qkv_split(const double* qkv, const AttentionShape& shape, double* q, double* k, double* v) override {
    inner_->qkv_split(qkv, shape, q, k, v);
  }
  void qkv_merge(const double* dq, const double* dk, const double* dv, const AttentionShape& shape,
                 double* dqkv) override {
    inner_->qkv_merge(dq, dk, dv, shape, dqkv);
  }
  void rope(double* x, const int32_t* position_ids, int64_t windows, int64_t heads, int64_t seq,
            int64_t head_dim, double theta, bool inverse) override {
    inner_->rope(x, position_ids, windows, heads, seq, head_dim, theta, inverse);
    check(inverse ? "rope inverse x" : "rope x", Format::kBf16, x, windows * heads * seq * head_dim);
  }
  void attention_block_forward(const double* q, const double* k, const double* v, const AttentionBlock& block,
                               bool document_masking, const AttentionDropout& dropout,
                               const AttentionShape& s, double* out, double* lse) override {
    check("attention_forward q", Format::kBf16, q, s.windows * s.num_heads * s.seq * s.head_dim);
    check("attention_forward k", Format::kBf16, k, s.windows * s.num_kv_heads * block.key_seq * s.head_dim);
    inner_->attention_block_forward(q, k, v, block, document_masking, dropout, s, out, lse);
    check("attention_forward out", Format::kBf16, out, s.windows * s.seq * s.num_heads * s.head_dim);
    check("attention_forward lse", Format::kFp32, lse, s.windows * s.num_heads * s.seq);
  }
  void attention_block_backward(const double* dout, const double* q, const double* k, const double* v,
                                const double* out, const double* lse, const AttentionBlock& block,
                                bool document_masking, const AttentionDropout& dropout,
                                const AttentionShape& s, double* dq, double* dk, double* dv) override {
    check("attention_backward dout", Format::kBf16, dout, s.windows * s.seq * s.num_heads * s.head_dim);
    inner_->attention_block_backward(dout, q, k, v, out, lse, block, document_masking, dropout, s, dq, dk,
                                     dv);
    check("attention_backward dq", Format::kBf16, dq, s.windows * s.num_heads * s.seq * s.head_dim);
    check("attention_backward dk", Format::kBf16, dk,
          s.windows * s.num_kv_heads * block.key_seq * s.head_dim);
    check("attention_backward dv", Format::kBf16, dv,
          s.windows * s.num_kv_heads * block.key_seq * s.head_dim);
  }
  void attention_merge(const double* block_out, const double* block_lse, const AttentionShape& s, double* out,
                       double* lse) override {
    inner_->attention_merge(block_out, block_lse, s, out, lse);
    check("attention_merge out", Format::kBf16, out, s.windows * s.seq * s.num_heads * s.head_dim);
    check("attention_merge lse", Format::kFp32, lse, s.windows * s.num_heads * s.seq);
  }
  AttentionTileCount attention_tiles() const override { return inner_->attention_tiles(); }
  void hidden_dropout_mask(const DropoutSite& site, int64_t first_row, int64_t rows, int64_t seq,
                           int64_t hidden, double* keep_scale) override {
    inner_->hidden_dropout_mask(site, first_row, rows, seq, hidden, keep_scale);
    check("hidden_dropout_mask keep", Format::kFp32, keep_scale, rows * hidden);
  }
  void dropout_forward(const double* x, const double* keep_scale, int64_t n, double* y) override {
    check("dropout_forward x", Format::kBf16, x, n);
    inner_->dropout_forward(x, keep_scale, n, y);
    check("dropout_forward y", Format::kBf16, y, n);
  }
  void dropout_backward(const double* dy, const double* keep_scale, int64_t n, double* dx) override {
    inner_->dropout_backward(dy, keep_scale, n, dx);
    check("dropout_backward dx", Format::kBf16, dx, n);
  }
  void swiglu_forward(const double* fc1, int64_t rows, int64_t ffn, double* act) override {
    check("swiglu_forward fc1", Format::kBf16, fc1, rows * 2 * ffn);
    inner_->swiglu_forward(fc1, rows, ffn, act);
    check("swiglu_forward act", Format::kBf16, act, rows * ffn);
  }
  void swiglu_backward(const double* dact, const double* fc1, int64_t rows, int64_t ffn, double* dfc1,
                       double* act) override {
    check("swiglu_backward dact", Format::kBf16, dact, rows * ffn);
    inner_->swiglu_backward(dact, fc1, rows, ffn, dfc1, act);
    check("swiglu_backward dfc1", Format::kBf16, dfc1, rows * 2 * ffn);
    check("swiglu_backward act", Format::kBf16, act, rows * ffn);
  }
  void logits_row_max(const double* logits, int64_t rows, int64_t vocab_local, double* row_max) override {
    check("logits (BF16 GEMM output)", Format::kBf16, logits, rows * vocab_local);
    inner_->logits_row_max(logits, rows, vocab_local, row_max);
    check("logits_row_max", Format::kFp32, row_max, rows);
  }
  void cross_entropy_partials(const double* logits, const int32_t* targets, int64_t rows, int64_t vocab_local,
                              int64_t vocab_start, const double* row_max, double* sum_exp,
                              double* target_logit) override {
    inner_->cross_entropy_partials(logits, targets, rows, vocab_local, vocab_start, row_max, sum_exp,
                                   target_logit);
    check("cross_entropy_partials sum_exp", Format::kFp32, sum_exp, rows);
  }
  void cross_entropy_loss(const double* row_max, const double* sum_exp, const double* target_logit,
                          const int32_t* targets, int64_t rows, double* losses) override {
    inner_->cross_entropy_loss(row_max, sum_exp, target_logit, targets, rows, losses);
    check("cross_entropy_loss losses", Format::kFp32, losses, rows);
  }
  void cross_entropy_backward(const double* logits, const int32_t* targets, int64_t rows, int64_t vocab_local,
                              int64_t vocab_start, const double* row_max, const double* sum_exp,
                              double loss_weight, double* dlogits) override {
    inner_->cross_entropy_backward(logits, targets, rows, vocab_local, vocab_start, row_max, sum_exp,
                                   loss_weight, dlogits);
    check("cross_entropy_backward dlogits", Format::kBf16, dlogits, rows * vocab_local);
  }
  void add_inplace(double* x, const double* y, int64_t n) override {
    check("add_inplace y", Format::kBf16, y, n);
    inner_->add_inplace(x, y, n);
    check("add_inplace x (residual stream)", Format::kBf16, x, n);
  }
  void adamw_update(double* param, const double* grad, double* exp_avg, double* exp_avg_sq, int64_t n,
                    const AdamWStep& step) override {
    check("adamw_update master weights in", Format::kFp32, param, n);
    inner_->adamw_update(param, grad, exp_avg, exp_avg_sq, n, step);
    check("adamw_update master weights out", Format::kFp32, param, n);
    check("adamw_update exp_avg", Format::kFp32, exp_avg, n);
    check("adamw_update exp_avg_sq", Format::kFp32, exp_avg_sq, n);
  }

 private:
  void check(const std::string& what, Format format, const double* x, int64_t n) {
    if (x == nullptr) return;  // a half of linear_backward (backend.h): the other half's tensors are null
    Tally& t = tallies_[what];
    for (int64_t i = 0; i < n; ++i) {
      const bool ok = format == Format::kBf16 ? testing::is_bf16(x[i]) : testing::is_fp32(x[i]);
      t.checked += 1;
      t.wrong += !ok;
    }
  }

  std::unique_ptr<Backend> inner_;
  std::map<std::string, Tally> tallies_;
};

Config bf16_dropout_config(bool fusion) {
  Config c = testing::tiny_config();
  c.precision = Precision::kBf16;
  c.train.grad_accumulation_fusion = fusion;
  c.model.attention_dropout = 0.1;
  c.model.hidden_dropout = 0.1;
  return c;
}

std::vector<data::Document> documents() {
  return {{5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, {3, 4}, {15, 2, 9}, {7, 7, 8, 2, 3, 4, 5, 6, 11, 12, 13}};
}

bool all_in(const ParamTensors& tensors, Format format) {
  for (const auto& t : tensors.tensors) {
    for (double v : t) {
      if (!(format == Format::kBf16 ? testing::is_bf16(v) : testing::is_fp32(v))) return false;
    }
  }
  return true;
}

TEST(RoundingPointsInAStep, EveryOperatorSeesAndReturnsItsFormat) {
  for (bool fusion : {true, false}) {
    SCOPED_TRACE(fusion ? "fusion on" : "fusion off");
    const Config config = bf16_dropout_config(fusion);
    const ParamTable table(config.model);
    const ParamTensors init = init_parameters(table, config.model, 11);
    EXPECT_FALSE(all_in(init, Format::kFp32));  // the trainer must round them to its FP32 masters
    FormatCheckingBackend backend(BackendOptions{Precision::kBf16, fusion});
    SingleProcessContext single;
    Trainer trainer(config, init, backend, single.context());
    EXPECT_TRUE(all_in(trainer.params(), Format::kFp32)) << "master weights";
    EXPECT_FALSE(all_in(trainer.params(), Format::kBf16)) << "the masters keep FP32 bits the copy drops";
    const GlobalBatch batch = testing::batch_from_documents(config, documents());
    for (int s = 0; s < 2; ++s) trainer.step(batch, false);
    EXPECT_TRUE(all_in(trainer.params(), Format::kFp32)) << "master weights";
    EXPECT_FALSE(all_in(trainer.params(), Format::kBf16)) << "master weights";
    const AdamWState moments = trainer.optimizer_moments();
    EXPECT_TRUE(all_in(moments.exp_avg, Format::kFp32));
    EXPECT_TRUE(all_in(moments.exp_avg_sq, Format::kFp32));
    // Every rounding point was passed through, with every element in its format.
    for (const char* op : {"linear_forward weight",
                           "linear_forward y",
                           "linear_backward dx",
                           "linear_backward dW main grad",
                           "embedding_forward table",
                           "embedding_forward y",
                           "embedding_backward dtable main grad",
                           "rmsnorm_forward y",
                           "rmsnorm_forward rstd",
                           "rmsnorm_backward dx",
                           "rmsnorm_backward dw main grad",
                           "rope x",
                           "rope inverse x",
                           "attention_forward out",
                           "attention_forward lse",
                           "attention_backward dq",
                           "attention_backward dk",
                           "attention_backward dv",
                           "dropout_forward y",
                           "dropout_backward dx",
                           "swiglu_forward act",
                           "swiglu_backward dfc1",
                           "swiglu_backward act",
                           "logits (BF16 GEMM output)",
                           "cross_entropy_loss losses",
                           "cross_entropy_backward dlogits",
                           "add_inplace x (residual stream)",
                           "adamw_update master weights out",
                           "adamw_update exp_avg",
                           "adamw_update exp_avg_sq"}) {
      EXPECT_TRUE(backend.tallies().count(op)) << op << " was never called";
    }
    for (const auto& [what, tally] : backend.tallies()) {
      EXPECT_GT(tally.checked, 0) << what;
      EXPECT_EQ(tally.wrong, 0) << what << ": " << tally.wrong << " of " << tally.checked
                                << " elements not in the format of docs/precision.md";
    }
  }
}

}  // namespace
}  // namespace touchstone
