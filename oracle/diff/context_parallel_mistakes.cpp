// The attention of two context-parallel mistakes (context_parallel_mistakes.h).
#include "oracle/diff/context_parallel_mistakes.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "parallel/context/load_balanced_split.h"

namespace touchstone::diff {

namespace {

// Only whole-window calls: queries and keys are the window's positions 0..T-1.
void expect_whole_window(const AttentionBlock& block, const AttentionShape& shape) {
  if (block.key_seq != block.window_seq || shape.seq != block.window_seq) {
    throw std::logic_error("ContextParallelMistakeBackend: a block of a window reached a one-rank backend");
  }
}

// Rows `rows` of each [b, heads, T, D] head of x: -> [b, heads, rows.size(), D].
std::vector<double> take_rows(const double* x, int64_t heads_total, int64_t seq, int64_t dim,
                              const std::vector<int32_t>& rows) {
  const auto n = static_cast<int64_t>(rows.size());
  std::vector<double> out(static_cast<size_t>(heads_total * n * dim));
  for (int64_t h = 0; h < heads_total; ++h) {
    for (int64_t j = 0; j < n; ++j) {
      const double* from = x + (h * seq + rows[static_cast<size_t>(j)]) * dim;
      std::copy(from, from + dim, out.begin() + (h * n + j) * dim);
    }
  }
  return out;
}

// x[b, heads, T, D] rows `rows` += y[b, heads, rows.size(), D].
void add_rows(const std::vector<double>& y, int64_t heads_total, int64_t seq, int64_t dim,
              const std::vector<int32_t>& rows, double* x) {
  const auto n = static_cast<int64_t>(rows.size());
  for (int64_t h = 0; h < heads_total; ++h) {
    for (int64_t j = 0; j < n; ++j) {
      double* to = x + (h * seq + rows[static_cast<size_t>(j)]) * dim;
      for (int64_t d = 0; d < dim; ++d) to[d] += y[static_cast<size_t>((h * n + j) * dim + d)];
    }
  }
}

// The keys of cp rank s in every window: their rows (positions), positions and document ids per window.
struct KeyBlock {
  std::vector<int32_t> rows;       // [Tk] positions in the window, ascending
  std::vector<int32_t> positions;  // [b*Tk]
  std::vector<int32_t> documents;  // [b*Tk]
  std::vector<double> k, v;        // [b, NKV, Tk, D]
};

KeyBlock key_block(const LoadBalancedSplit& split, int rank, const double* k, const double* v,
                   const AttentionBlock& block, const AttentionShape& shape) {
  KeyBlock b;
  b.rows = split.positions(rank);
  b.positions = split.positions(rank, shape.windows);
  b.documents = split.take(block.key_document_ids, rank, shape.windows);
  const int64_t kv_heads = shape.windows * shape.num_kv_heads;
  b.k = take_rows(k, kv_heads, shape.seq, shape.head_dim, b.rows);
  b.v = take_rows(v, kv_heads, shape.seq, shape.head_dim, b.rows);
  return b;
}

AttentionBlock placed(const AttentionBlock& whole, const KeyBlock& keys) {
  AttentionBlock b = whole;
  b.key_seq = static_cast<int64_t>(keys.rows.size());
  b.key_positions = keys.positions.data();
  b.key_document_ids = keys.documents.data();
  return b;
}

// kChunksNotLoadBalanced: the whole-window block with every window's slot i at position p(i).
struct SlotPositions {
  SlotPositions(const AttentionBlock& whole, const AttentionShape& shape, int cp) : block(whole) {
    const std::vector<int32_t> slot = load_balanced_slot_positions(shape.seq, cp);
    positions.resize(static_cast<size_t>(shape.windows * shape.seq));
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = slot[i % static_cast<size_t>(shape.seq)];
    block.query_positions = positions.data();
    block.key_positions = positions.data();
  }
  SlotPositions(const SlotPositions&) = delete;  // block points into positions
  SlotPositions& operator=(const SlotPositions&) = delete;

  std::vector<int32_t> positions;  // [b*T]
  AttentionBlock block;
};

}  // namespace

std::vector<int32_t> load_balanced_slot_positions(int64_t seq, int cp) {
  const LoadBalancedSplit split(seq, cp);
  std::vector<int32_t> positions;
  positions.reserve(static_cast<size_t>(seq));
  for (int rank = 0; rank < cp; ++rank) {
    for (int32_t p : split.positions(rank)) positions.push_back(p);
  }
  return positions;
}

std::string ContextParallelMistakeBackend::name() const {
  return std::string("cpu (cp ") + std::to_string(cp_) +
         (mistake_ == ContextParallelMistake::kMergeWithoutLse
              ? ", blocks merged without log-sum-exp weights)"
              : ", chunks not load balanced)");
}

void ContextParallelMistakeBackend::attention_block_forward(
    const double* q, const double* k, const double* v, const AttentionBlock& block, bool document_masking,
    const AttentionDropout& dropout, const AttentionShape& shape, double* out, double* lse) {
  expect_whole_window(block, shape);
  if (mistake_ == ContextParallelMistake::kChunksNotLoadBalanced) {
    SlotPositions moved(block, shape, cp_);
    CpuBackend::attention_block_forward(q, k, v, moved.block, document_masking, dropout, shape, out, lse);
    return;
  }
  // out = the plain sum of the blocks' outputs. No single softmax gives it, so lse has no meaning here:
  // it is left at -inf, and this backend's backward recomputes each block's own out and lse instead.
  const LoadBalancedSplit split(shape.seq, cp_);
  const size_t out_size = static_cast<size_t>(shape.windows * shape.seq * shape.num_heads * shape.head_dim);
  std::vector<double> block_out(out_size),
      block_lse(static_cast<size_t>(shape.windows * shape.num_heads * shape.seq));
  std::fill(out, out + out_size, 0.0);
  std::fill(lse, lse + block_lse.size(), -std::numeric_limits<double>::infinity());
  for (int rank = 0; rank < cp_; ++rank) {
    const KeyBlock keys = key_block(split, rank, k, v, block, shape);
    CpuBackend::attention_block_forward(q, keys.k.data(), keys.v.data(), placed(block, keys),
                                        document_masking, dropout, shape, block_out.data(), block_lse.data());
    for (size_t i = 0; i < out_size; ++i) out[i] += block_out[i];
  }
}

void ContextParallelMistakeBackend::attention_block_backward(
    const double* dout, const double* q, const double* k, const double* v, const double* out,
    const double* lse, const AttentionBlock& block, bool document_masking, const AttentionDropout& dropout,
    const AttentionShape& shape, double* dq, double* dk, double* dv) {
  expect_whole_window(block, shape);
  if (mistake_ == ContextParallelMistake::kChunksNotLoadBalanced) {
    SlotPositions moved(block, shape, cp_);
    CpuBackend::attention_block_backward(dout, q, k, v, out, lse, moved.block, document_masking, dropout,
                                         shape, dq, dk, dv);
    return;
  }
  // Each block's own attention again (its out_s and lse_s), then its softmax backward with d out_s = d out.
  const LoadBalancedSplit split(shape.seq, cp_);
  const int64_t D = shape.head_dim, kv_heads = shape.windows * shape.num_kv_heads;
  const size_t q_size = static_cast<size_t>(shape.windows * shape.num_heads * shape.seq * D);
  const size_t kv_size = static_cast<size_t>(kv_heads * shape.seq * D);
  std::fill(dq, dq + q_size, 0.0);
  std::fill(dk, dk + kv_size, 0.0);
  std::fill(dv, dv + kv_size, 0.0);
  std::vector<double> block_out(q_size),
      block_lse(static_cast<size_t>(shape.windows * shape.num_heads * shape.seq)), block_dq(q_size);
  for (int rank = 0; rank < cp_; ++rank) {
    const KeyBlock keys = key_block(split, rank, k, v, block, shape);
    const AttentionBlock at = placed(block, keys);
    CpuBackend::attention_block_forward(q, keys.k.data(), keys.v.data(), at, document_masking, dropout, shape,
                                        block_out.data(), block_lse.data());
    std::vector<double> block_dk(keys.k.size()), block_dv(keys.v.size());
    CpuBackend::attention_block_backward(dout, q, keys.k.data(), keys.v.data(), block_out.data(),
                                         block_lse.data(), at, document_masking, dropout, shape,
                                         block_dq.data(), block_dk.data(), block_dv.data());
    for (size_t i = 0; i < q_size; ++i) dq[i] += block_dq[i];
    add_rows(block_dk, kv_heads, shape.seq, D, keys.rows, dk);
    add_rows(block_dv, kv_heads, shape.seq, D, keys.rows, dv);
  }
}

}  // namespace touchstone::diff
