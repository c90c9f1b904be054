// The CUDA backend: the operators of kernels/backend.h on one GPU, checked against the CPU reference
// (tests/gpu/). Each operator's body lives in the file named next to it; docs/cuda.md says how each
// kernel computes and why its result is deterministic.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/backend.h"
#include "kernels/cpu/rounding.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/gemm.cuh"

namespace touchstone {

class CudaBackend final : public Backend {
 public:
  // Uses GPU `device`; throws std::runtime_error when it cannot be used.
  CudaBackend(const BackendOptions& options, int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  const BackendOptions& options() const override { return options_; }

  // kernels/cuda/linear.cu (GEMMs through cuBLAS, embedding, residual add, rounding)
  void round(TensorRole role, double* x, int64_t n) override;
  void linear_forward(const double* x, const double* weight, int64_t rows, int64_t in, int64_t out,
                      double* y) override;
  void linear_backward(const double* dy, const double* x, const double* weight, int64_t rows, int64_t in,
                       int64_t out, double* dx, double* dweight_accum) override;
  void embedding_forward(const int32_t* tokens, const double* table, int64_t rows, int64_t hidden,
                         int64_t vocab_start, int64_t vocab_local, double* y) override;
  void embedding_backward(const int32_t* tokens, const double* dy, int64_t rows, int64_t hidden,
                          int64_t vocab_start, int64_t vocab_local, double* dtable_accum) override;
  void add_inplace(double* x, const double* y, int64_t n) override;

  // kernels/cuda/normalization.cu (RMSNorm, RoPE, SwiGLU, the qkv layout)
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

  // kernels/cuda/attention.cu (attention_merge: kernels/cuda/attention_merge.cu)
  void attention_block_forward(const double* q, const double* k, const double* v, const AttentionBlock& block,
                               bool document_masking, const AttentionDropout& dropout,
                               const AttentionShape& shape, double* out, double* lse) override;
  void attention_block_backward(const double* dout, const double* q, const double* k, const double* v,
                                const double* out, const double* lse, const AttentionBlock& block,
                                bool document_masking, const AttentionDropout& dropout,
                                const AttentionShape& shape, double* dq, double* dk, double* dv) override;
  void attention_merge(const double* block_out, const double* block_lse, const AttentionShape& shape,
                       double* out, double* lse) override;
  AttentionTileCount attention_tiles() const override { return tiles_; }

  // kernels/cuda/dropout.cu
  void hidden_dropout_mask(const DropoutSite& site, int64_t first_row, int64_t rows, int64_t seq,
                           int64_t hidden, double* keep_scale) override;
  void dropout_forward(const double* x, const double* keep_scale, int64_t n, double* y) override;
  void dropout_backward(const double* dy, const double* keep_scale, int64_t n, double* dx) override;

  // kernels/cuda/loss_and_optimizer.cu
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

 private:
  Precision precision() const { return options_.precision; }
  // Every operator starts with this: the staging list is reused from its first buffer.
  cuda::Staging& begin_call() {
    staging_.begin();
    return staging_;
  }

  BackendOptions options_;
  cpu::Rounding rounding_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cuda::Staging staging_{nullptr};
  cuda::GemmScratch gemm_scratch_;
  AttentionTileCount tiles_;  // attention_block_forward's, summed over calls (counted on the host)
};

}  // namespace touchstone
