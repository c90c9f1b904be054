// CUDA attention against the CPU reference in every precision: the forward (out, lse) and the
// backward (dq, dk, dv) on shapes that reach the kernels' edges (T not a multiple of the 64-position
// tile, T = 1, single-token documents, all-padding windows, GQA, head_dim 6, several windows), with and
// without attention dropout; the tile pairs both backends count; the mask and the dropout drawn inside
// the kernels, exactly; and bitwise repeatability of two GPU calls. Blocks of a window (context
// parallelism: query rows at some chunks of the window, key rows at others): the block forward,
// backward and merge against the CPU's, rows that see no key of a block (out 0, lse -inf on both), and
// the blocks' results merged (summed, for the gradients) against the whole window's on the GPU.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "data/packing.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dropout_mask.h"
#include "tests/gpu/gpu_compare.h"

namespace touchstone::gpu_testing {

namespace {

struct AttentionCase {
  std::string name;
  AttentionShape shape;
  std::vector<int32_t> document_ids;  // [b*T]; empty: no document masking
  bool rows_see_one_key = false;      // every query sees only its own key: dq = dk = 0 in exact arithmetic
};

// ids += `count` positions of document `id`
void append(std::vector<int32_t>& ids, int32_t id, int64_t count) { ids.insert(ids.end(), count, id); }

std::vector<AttentionCase> cases() {
  std::vector<AttentionCase> all;
  {  // GQA, two windows of several documents; one single-token document, trailing padding.
    AttentionCase c{"gqa_documents", AttentionShape{2, 37, 4, 2, 8}, {}};
    append(c.document_ids, 0, 10);
    append(c.document_ids, 1, 1);
    append(c.document_ids, 2, 15);
    append(c.document_ids, 3, 11);  // window 0 ends
    append(c.document_ids, 3, 20);  // the document continued into window 1
    append(c.document_ids, data::kPaddingDocument, 17);
    all.push_back(c);
  }
  // Plain causal attention with T = 37: rows of every length up to T, no tile size divides T.
  all.push_back(AttentionCase{"causal_37", AttentionShape{1, 37, 4, 1, 16}, {}});
  // T = 300 > 256 threads: rows with more keys than threads, with and without documents; head_dim 6.
  all.push_back(AttentionCase{"causal_300", AttentionShape{1, 300, 2, 1, 6}, {}});
  {
    AttentionCase c{"documents_300", AttentionShape{2, 300, 4, 2, 8}, {}};
    append(c.document_ids, 0, 130);
    append(c.document_ids, 1, 1);
    append(c.document_ids, 2, 169);  // window 0 ends; document 2 spans keys below and above 256
    append(c.document_ids, 2, 280);
    append(c.document_ids, data::kPaddingDocument, 20);
    all.push_back(c);
  }
  {  // T = 1: each row sees only itself; one window is padding.
    AttentionCase c{"seq_1", AttentionShape{3, 1, 4, 1, 6}, {5, data::kPaddingDocument, 7}, true};
    all.push_back(c);
  }
  {  // Every document a single token: P = 1 on the diagonal, dS = 0, out = P' v.
    AttentionCase c{"single_token_documents", AttentionShape{2, 9, 2, 2, 4}, {}, true};
    for (int32_t i = 0; i < 18; ++i) append(c.document_ids, i, 1);
    all.push_back(c);
  }
  {  // A window that is all padding (one document of id -1), and one that is mostly padding.
    AttentionCase c{"all_padding", AttentionShape{2, 20, 3, 1, 6}, {}};
    append(c.document_ids, data::kPaddingDocument, 20);
    append(c.document_ids, 3, 5);
    append(c.document_ids, data::kPaddingDocument, 15);
    all.push_back(c);
  }
  return all;
}

struct Operands {
  std::vector<double> q, k, v, dout;  // [b,NH,T,D], [b,NKV,T,D] x 2, [N, NH*D]
  std::vector<int64_t> samples;       // [b] the windows' global sample indices
  AttentionDropout dropout;           // inactive without dropout; its site points into `samples`
};

Operands operands(const AttentionCase& c, Precision precision, double dropout) {
  const AttentionShape& s = c.shape;
  const int64_t q_elements = s.windows * s.num_heads * s.seq * s.head_dim;
  const int64_t kv_elements = s.windows * s.num_kv_heads * s.seq * s.head_dim;
  Operands o{random_values(c.name + "/q", q_elements, precision),
             random_values(c.name + "/k", kv_elements, precision),
             random_values(c.name + "/v", kv_elements, precision),
             random_values(c.name + "/dout", q_elements, precision),
             std::vector<int64_t>(static_cast<size_t>(s.windows)),
             {}};
  for (int64_t w = 0; w < s.windows; ++w) o.samples[static_cast<size_t>(w)] = 40 + w;
  // first_head 1: this rank's heads are not the model's first (tensor parallelism).
  if (dropout > 0.0)
    o.dropout =
        AttentionDropout{DropoutSite{stream_key(1234, c.name + "/dropout"), dropout, o.samples.data()}, 1};
  return o;
}

struct Forward {
  std::vector<double> out, lse;  // [N, NH*D], [b,NH,T]
};
struct Backward {
  std::vector<double> dq, dk, dv;  // [b,NH,T,D], [b,NKV,T,D] x 2
};

const int32_t* documents(const AttentionCase& c) {
  return c.document_ids.empty() ? nullptr : c.document_ids.data();
}

Forward forward(Backend& backend, const AttentionCase& c, const Operands& o) {
  const AttentionShape& s = c.shape;
  Forward f{std::vector<double>(static_cast<size_t>(s.windows * s.seq * s.num_heads * s.head_dim)),
            std::vector<double>(static_cast<size_t>(s.windows * s.num_heads * s.seq))};
  backend.attention_forward(o.q.data(), o.k.data(), o.v.data(), documents(c), !c.document_ids.empty(),
                            o.dropout, s, f.out.data(), f.lse.data());
  return f;
}

Backward backward(Backend& backend, const AttentionCase& c, const Operands& o, const Forward& f) {
  const AttentionShape& s = c.shape;
  Backward g{std::vector<double>(o.q.size()), std::vector<double>(o.k.size()),
             std::vector<double>(o.v.size())};
  backend.attention_backward(o.dout.data(), o.q.data(), o.k.data(), o.v.data(), f.out.data(), f.lse.data(),
                             documents(c), !c.document_ids.empty(), o.dropout, s, g.dq.data(), g.dk.data(),
                             g.dv.data());
  return g;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The scales of dq and dk where every query sees only its own key (rows_see_one_key). Then P_ii = 1 and
// dq_i = scale * (dP_ii - Delta_i) K_i, dk_i = the same summed over the group's heads times Q_i, where
// dP_ii = dO_i . V_i M_ii / (1 - p) and Delta_i = dO_i . O_i are equal in exact arithmetic: both results
// are 0, and each backend holds only the rounding of two D-term dot products, each within
// D u sum_d |dO_id V_id| / (1 - p) (in BF16 mode with dropout O_i = V_i / (1 - p) is stored in BF16, so
// both also hold that rounding, 2^-8 of the same terms, the same in both). Measured against their own norms
// these are noise against noise (a relative error near 1 in every precision), so dq and dk are measured
// against the norms of scale * |dO_i| . |V_i| / (1 - p) * |K_i| and its sum over the group's heads times
// |Q_i|: the sizes of the terms that cancel, which a wrong softmax backward (a missing Delta, a P not 1)
// leaves in full.
struct CancellationScale {
  double dq = 0.0, dk = 0.0;
};

CancellationScale one_key_cancellation_scale(const AttentionShape& s, const Operands& o) {
  const int64_t T = s.seq, D = s.head_dim, NH = s.num_heads, NKV = s.num_kv_heads, group = NH / NKV;
  const double keep_scale = 1.0 / (1.0 - o.dropout.site.probability);
  std::vector<double> dk_scale(o.k.size(), 0.0);
  double dq_norm = 0.0;
  for (int64_t w = 0; w < s.windows; ++w) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / group;
      for (int64_t t = 0; t < T; ++t) {
        const double* dout = &o.dout[static_cast<size_t>(((w * T + t) * NH + h) * D)];
        const size_t q_row = static_cast<size_t>(((w * NH + h) * T + t) * D);
        const size_t kv_row = static_cast<size_t>(((w * NKV + g) * T + t) * D);
        double terms = 0.0;  // |dO_i| . |V_i|
        for (int64_t d = 0; d < D; ++d) terms += std::fabs(dout[d] * o.v[kv_row + static_cast<size_t>(d)]);
        const double f = s.scale() * keep_scale * terms;
        for (int64_t d = 0; d < D; ++d) {
          const size_t e = static_cast<size_t>(d);
          dq_norm += (f * o.k[kv_row + e]) * (f * o.k[kv_row + e]);
          dk_scale[kv_row + e] += f * std::fabs(o.q[q_row + e]);
        }
      }
    }
  }
  double dk_norm = 0.0;
  for (const double x : dk_scale) dk_norm += x * x;
  return CancellationScale{std::sqrt(dq_norm), std::sqrt(dk_norm)};
}

TEST(CudaAttention, MatchesTheCpuReference) {
  for (const Precision precision : kAllPrecisions) {
    BackendPair pair(precision);
    const bool bf16 = precision == Precision::kBf16;
    for (const AttentionCase& c : cases()) {
      for (const double dropout : {0.0, 0.25}) {
        SCOPED_TRACE(option_name(precision) + " " + c.name + (dropout > 0.0 ? " with dropout" : ""));
        const AttentionShape& s = c.shape;
        const int64_t T = s.seq, D = s.head_dim, heads_per_group = s.num_heads / s.num_kv_heads;
        const Operands o = operands(c, precision, dropout);
        const Forward cpu = forward(*pair.cpu, c, o), gpu = forward(*pair.gpu, c, o);
        // lse: the max of D-term dot products plus the log of a T-term sum; FP32 outside FP64.
        EXPECT_GPU_MATCHES(gpu.lse, cpu.lse, tolerance(precision, T + D, false));
        // out: the T-term sum (P~ M) V over the same scores, divided by that sum; an activation.
        EXPECT_GPU_MATCHES(gpu.out, cpu.out, tolerance(precision, T + D, bf16));

        // Both backwards read the CPU's out and lse, so each result measures the backward kernels alone.
        const Backward cpu_grad = backward(*pair.cpu, c, o, cpu);
        const Backward gpu_grad = backward(*pair.gpu, c, o, cpu);
        // dq: P from a D-term score, dP and Delta D-term dot products, dS K a T-term sum; an activation.
        // dk: dS (its D-term score and dP) summed over the group's heads x T query rows; dv: P' dO over
        // the same rows, P' recomputed from a D-term score (the + D: P was an input of the backward
        // before lse replaced it). Both accumulated in FP32 (FP64) and stored once as activations.
        const double dq_tolerance = tolerance(precision, T + D, bf16);
        const double kv_tolerance = tolerance(precision, heads_per_group * T + D, bf16);  // dk and dv
        if (c.rows_see_one_key) {  // dq = dk = 0: against the size of what cancels (measured: 1e-16
                                   // of it in FP64, 4e-8 in FP32, 0 in BF16: the same bits there)
          const CancellationScale scale = one_key_cancellation_scale(s, o);
          EXPECT_LE(l2_distance(gpu_grad.dq, cpu_grad.dq), dq_tolerance * scale.dq) << "dq vs CPU";
          EXPECT_LE(l2_distance(gpu_grad.dk, cpu_grad.dk), kv_tolerance * scale.dk) << "dk vs CPU";
        } else {
          EXPECT_GPU_MATCHES(gpu_grad.dq, cpu_grad.dq, dq_tolerance);
          EXPECT_GPU_MATCHES(gpu_grad.dk, cpu_grad.dk, kv_tolerance);
        }
        EXPECT_GPU_MATCHES(gpu_grad.dv, cpu_grad.dv, kv_tolerance);
      }
    }
    // Both count the pairs of one tile rule; documents_300 has pairs no document spans.
    SCOPED_TRACE(option_name(precision));
    const AttentionTileCount cpu_tiles = pair.cpu->attention_tiles(), gpu_tiles = pair.gpu->attention_tiles();
    EXPECT_EQ(gpu_tiles.computed, cpu_tiles.computed);
    EXPECT_EQ(gpu_tiles.skipped, cpu_tiles.skipped);
    EXPECT_GT(gpu_tiles.skipped, 0);
  }
}

// With q = k = 0 every visible score is 0, so P is 1 / n_i on the n_i keys query i sees, and with D = T
// and V_j the unit vector e_j, out_i[j] = M_ij / n_i: every value exact in each precision, 0 exactly
// where the mask hides key j or dropout drops it. So the GPU's out must be the CPU's bit for bit, and
// its zeros must be the CPU's whole dropout mask's zeros and the hidden keys. T = 70: two tiles, and
// window 0's documents leave the pair (query tile 1, key tile 0) empty, so it is skipped too.
TEST(CudaAttention, MaskAndDropoutInsideTheKernelAreTheCpuOnes) {
  const int64_t T = 70;
  const AttentionShape s{2, T, 4, 2, T};
  AttentionCase c{"exact", s, {}};
  append(c.document_ids, 0, 64);
  append(c.document_ids, 1, 6);  // window 0 ends
  append(c.document_ids, 3, 30);
  append(c.document_ids, data::kPaddingDocument, 40);
  const std::vector<int64_t> samples = {7, 1000003};
  const DropoutSite site{stream_key(5, "dropout.test"), 0.3, samples.data()};
  for (const Precision precision : kAllPrecisions) {
    SCOPED_TRACE(option_name(precision));
    BackendPair pair(precision);
    Operands o{std::vector<double>(static_cast<size_t>(s.windows * s.num_heads * T * T), 0.0),
               std::vector<double>(static_cast<size_t>(s.windows * s.num_kv_heads * T * T), 0.0),
               std::vector<double>(static_cast<size_t>(s.windows * s.num_kv_heads * T * T), 0.0),
               {},
               samples,
               AttentionDropout{site, 2}};
    o.dropout.site.sample_indices = o.samples.data();
    for (int64_t w = 0; w < s.windows * s.num_kv_heads; ++w) {
      for (int64_t j = 0; j < T; ++j) o.v[static_cast<size_t>((w * T + j) * T + j)] = 1.0;
    }
    const Forward cpu = forward(*pair.cpu, c, o), gpu = forward(*pair.gpu, c, o);
    EXPECT_EQ(gpu.out, cpu.out);

    std::vector<double> mask(static_cast<size_t>(s.windows * s.num_heads * T * T));
    fill_attention_dropout_mask(site, s, 2, pair.options.precision, mask.data());
    int64_t wrong = 0, dropped = 0;
    for (int64_t b = 0; b < s.windows; ++b) {
      for (int64_t h = 0; h < s.num_heads; ++h) {
        for (int64_t i = 0; i < T; ++i) {
          for (int64_t j = 0; j < T; ++j) {
            const bool visible = j <= i && c.document_ids[static_cast<size_t>(b * T + j)] ==
                                               c.document_ids[static_cast<size_t>(b * T + i)];
            const bool kept = mask[static_cast<size_t>(((b * s.num_heads + h) * T + i) * T + j)] != 0.0;
            const double value = gpu.out[static_cast<size_t>((b * T + i) * s.num_heads * T + h * T + j)];
            wrong += (value != 0.0) != (visible && kept);
            dropped += visible && !kept;
          }
        }
      }
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_GT(dropped, 0);
    const AttentionTileCount cpu_tiles = pair.cpu->attention_tiles(), gpu_tiles = pair.gpu->attention_tiles();
    EXPECT_EQ(gpu_tiles.computed, cpu_tiles.computed);
    EXPECT_EQ(gpu_tiles.skipped, cpu_tiles.skipped);
    // per head: (0, 1) of both windows after every query, and window 0's (1, 0) between documents
    EXPECT_EQ(gpu_tiles.skipped, 3 * s.num_heads);
    EXPECT_EQ(gpu_tiles.computed, 5 * s.num_heads);
  }
}

TEST(CudaAttention, TwoCallsGiveIdenticalBits) {
  for (const Precision precision : kAllPrecisions) {
    SCOPED_TRACE(option_name(precision));
    BackendPair pair(precision);
    for (const AttentionCase& c : cases()) {
      if (c.name != "documents_300") continue;  // GQA, documents, several tiles, some skipped
      const Operands o = operands(c, precision, 0.25);
      const Forward first = forward(*pair.gpu, c, o), second = forward(*pair.gpu, c, o);
      EXPECT_TRUE(same_bits(first.out, second.out));
      EXPECT_TRUE(same_bits(first.lse, second.lse));
      const Backward grad = backward(*pair.gpu, c, o, first);
      const Backward again = backward(*pair.gpu, c, o, first);
      EXPECT_TRUE(same_bits(grad.dq, again.dq));
      EXPECT_TRUE(same_bits(grad.dk, again.dk));
      EXPECT_TRUE(same_bits(grad.dv, again.dv));
    }
  }
}

// Blocks of a window. Each window of T positions is cut into chunks of `chunk` positions; a block's query
// rows are some chunks of every window and its key rows others (context parallelism gives a rank the
// query chunks {r, 2R-1-r} and computes them against one rank's key chunks at a time).
struct BlockCase {
  AttentionCase whole;                           // the window, its documents (none: no masking)
  int64_t chunk;                                 // positions per chunk
  std::vector<std::vector<int64_t>> queries;     // chunks of each query block; together every chunk once
  std::vector<std::vector<int64_t>> key_blocks;  // chunks of each key block beyond the single chunks
};

std::vector<BlockCase> block_cases() {
  std::vector<BlockCase> all;
  {  // GQA and documents, two windows of 4 chunks of 24. Window 0: documents 0, 1, 2 start at 0, 30
     // and 60, so the queries at 30..71 see no key of chunk 0; window 1: one document of 50, then padding.
    BlockCase c{AttentionCase{"blocks_96", AttentionShape{2, 96, 4, 2, 8}, {}}, 24, {{1, 2}, {0, 3}}, {}};
    append(c.whole.document_ids, 0, 30);
    append(c.whole.document_ids, 1, 30);
    append(c.whole.document_ids, 2, 36);  // window 0 ends
    append(c.whole.document_ids, 3, 50);
    append(c.whole.document_ids, data::kPaddingDocument, 46);
    c.key_blocks = {{0, 3}, {1, 2}};
    all.push_back(c);
  }
  {  // Causal only, 4 chunks of 75: blocks of 150 rows span three tiles, and a tile of a block may hold
     // positions of two chunks. Queries {0, 3} against keys {1, 2}: the rows at 0..74 see no key.
    BlockCase c{AttentionCase{"blocks_300", AttentionShape{1, 300, 2, 1, 6}, {}}, 75, {{0, 3}, {1, 2}}, {}};
    c.key_blocks = {{1, 2}, {0, 3}};
    all.push_back(c);
  }
  return all;
}

// The rows of one side of a block: positions in the window and their document ids.
struct Rows {
  std::vector<int32_t> positions, document_ids;  // [b*n]; document ids empty without masking
  int64_t per_window = 0;                        // n
};

Rows rows_at(const AttentionCase& c, int64_t chunk, const std::vector<int64_t>& chunks) {
  Rows r;
  r.per_window = chunk * static_cast<int64_t>(chunks.size());
  for (int64_t w = 0; w < c.shape.windows; ++w) {
    for (const int64_t first : chunks) {
      for (int64_t t = 0; t < chunk; ++t) {
        const auto position = static_cast<int32_t>(first * chunk + t);
        r.positions.push_back(position);
        if (!c.document_ids.empty())
          r.document_ids.push_back(c.document_ids[static_cast<size_t>(w * c.shape.seq + position)]);
      }
    }
  }
  return r;
}

// x[b, heads, T, width] at `rows` -> [b, heads, n, width]: the rows' slices of q, k, v, lse, dq, dk, dv.
std::vector<double> head_rows(const std::vector<double>& x, int64_t heads, int64_t seq, int64_t width,
                              const Rows& rows) {
  const int64_t n = rows.per_window, windows = static_cast<int64_t>(rows.positions.size()) / n;
  std::vector<double> y;
  for (int64_t w = 0; w < windows; ++w) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t r = 0; r < n; ++r) {
        const auto first =
            x.begin() + ((w * heads + h) * seq + rows.positions[static_cast<size_t>(w * n + r)]) * width;
        y.insert(y.end(), first, first + width);
      }
    }
  }
  return y;
}

// x[b*T, width] at `rows` -> [b*n, width]: the rows' slices of out and dout.
std::vector<double> token_rows(const std::vector<double>& x, int64_t seq, int64_t width, const Rows& rows) {
  const int64_t n = rows.per_window, windows = static_cast<int64_t>(rows.positions.size()) / n;
  std::vector<double> y;
  for (int64_t w = 0; w < windows; ++w) {
    for (int64_t r = 0; r < n; ++r) {
      const auto first = x.begin() + (w * seq + rows.positions[static_cast<size_t>(w * n + r)]) * width;
      y.insert(y.end(), first, first + width);
    }
  }
  return y;
}

// One call of a block: its rows and its operands, cut from the whole window's.
struct BlockCall {
  AttentionShape shape{};  // seq = Tq
  int64_t window_seq = 0;
  Rows queries, keys;
  std::vector<double> q, k, v, dout;  // [b,NH,Tq,D], [b,NKV,Tk,D] x 2, [b*Tq, NH*D]
  AttentionBlock block() const {
    const bool masking = !queries.document_ids.empty();
    AttentionBlock b;
    b.key_seq = keys.per_window;
    b.window_seq = window_seq;
    b.query_positions = queries.positions.data();
    b.key_positions = keys.positions.data();
    b.query_document_ids = masking ? queries.document_ids.data() : nullptr;
    b.key_document_ids = masking ? keys.document_ids.data() : nullptr;
    return b;
  }
};

BlockCall block_call(const BlockCase& c, const Operands& o, const std::vector<int64_t>& query_chunks,
                     const std::vector<int64_t>& key_chunks) {
  const AttentionShape& s = c.whole.shape;
  const int64_t T = s.seq, D = s.head_dim;
  BlockCall call;
  call.shape = s;
  call.window_seq = T;
  call.queries = rows_at(c.whole, c.chunk, query_chunks);
  call.keys = rows_at(c.whole, c.chunk, key_chunks);
  call.shape.seq = call.queries.per_window;
  call.q = head_rows(o.q, s.num_heads, T, D, call.queries);
  call.k = head_rows(o.k, s.num_kv_heads, T, D, call.keys);
  call.v = head_rows(o.v, s.num_kv_heads, T, D, call.keys);
  call.dout = token_rows(o.dout, T, s.num_heads * D, call.queries);
  return call;
}

Forward block_forward(Backend& backend, const BlockCall& call, const AttentionDropout& dropout) {
  const AttentionShape& s = call.shape;
  Forward f{std::vector<double>(static_cast<size_t>(s.windows * s.seq * s.num_heads * s.head_dim)),
            std::vector<double>(static_cast<size_t>(s.windows * s.num_heads * s.seq))};
  backend.attention_block_forward(call.q.data(), call.k.data(), call.v.data(), call.block(),
                                  !call.queries.document_ids.empty(), dropout, s, f.out.data(), f.lse.data());
  return f;
}

// The block's backward from `merged`, the out and lse of the attention over every key block.
Backward block_backward(Backend& backend, const BlockCall& call, const AttentionDropout& dropout,
                        const Forward& merged) {
  Backward g{std::vector<double>(call.q.size()), std::vector<double>(call.k.size()),
             std::vector<double>(call.v.size())};
  backend.attention_block_backward(call.dout.data(), call.q.data(), call.k.data(), call.v.data(),
                                   merged.out.data(), merged.lse.data(), call.block(),
                                   !call.queries.document_ids.empty(), dropout, call.shape, g.dq.data(),
                                   g.dk.data(), g.dv.data());
  return g;
}

// `running` with `block` merged into it by `backend`.
Forward merged(Backend& backend, const AttentionShape& s, Forward running, const Forward& block) {
  backend.attention_merge(block.out.data(), block.lse.data(), s, running.out.data(), running.lse.data());
  return running;
}

// No key seen yet: out 0 and lse -inf on every row (merging a block into it gives that block's values).
Forward nothing_seen(const AttentionShape& s) {
  return Forward{std::vector<double>(static_cast<size_t>(s.windows * s.seq * s.num_heads * s.head_dim), 0.0),
                 std::vector<double>(static_cast<size_t>(s.windows * s.num_heads * s.seq),
                                     -std::numeric_limits<double>::infinity())};
}

// The rows (query, head) of f whose query sees no key: lse = -inf, and their out must be 0 exactly.
struct EmptyRows {
  std::vector<bool> rows;  // [b,NH,Tq]
  int64_t count = 0;
  int64_t nonzero_out = 0;  // entries of out that are not 0 on those rows
};

EmptyRows empty_rows(const Forward& f, const AttentionShape& s) {
  EmptyRows e;
  const int64_t T = s.seq, D = s.head_dim, NH = s.num_heads;
  for (int64_t row = 0; row < s.windows * NH * T; ++row) {
    const bool empty = f.lse[static_cast<size_t>(row)] == -std::numeric_limits<double>::infinity();
    e.rows.push_back(empty);
    if (!empty) continue;
    ++e.count;
    const int64_t i = row % T, h = row / T % NH, b = row / T / NH;
    for (int64_t d = 0; d < D; ++d)
      e.nonzero_out += f.out[static_cast<size_t>((b * T + i) * NH * D + h * D + d)] != 0.0;
  }
  return e;
}

// lse with the rows that see no key set to 0, so the rest can be measured.
std::vector<double> finite_part(std::vector<double> lse) {
  for (double& x : lse) {
    if (x == -std::numeric_limits<double>::infinity()) x = 0.0;
  }
  return lse;
}

// Every block of `c` on both backends: for each query block, the forward of every single key chunk and
// of the key_blocks, and their merges in chunk order (the GPU's merge takes the CPU's operands, so it is
// measured alone); then every block's backward from the CPU's out and lse over all the chunks.
TEST(CudaAttention, BlocksMatchTheCpuReference) {
  for (const Precision precision : kAllPrecisions) {
    BackendPair pair(precision);
    const bool bf16 = precision == Precision::kBf16;
    int64_t blocks_some_rows_empty = 0, blocks_all_rows_empty = 0;  // on the CPU
    for (const BlockCase& c : block_cases()) {
      const int64_t chunks = c.whole.shape.seq / c.chunk, D = c.whole.shape.head_dim;
      const int64_t heads_per_group = c.whole.shape.num_heads / c.whole.shape.num_kv_heads;
      std::vector<std::vector<int64_t>> key_blocks;
      for (int64_t k = 0; k < chunks; ++k) key_blocks.push_back({k});
      key_blocks.insert(key_blocks.end(), c.key_blocks.begin(), c.key_blocks.end());
      for (const double dropout : {0.0, 0.25}) {
        const Operands o = operands(c.whole, precision, dropout);
        for (const std::vector<int64_t>& query_chunks : c.queries) {
          const AttentionShape query_shape{c.whole.shape.windows,
                                           c.chunk * static_cast<int64_t>(query_chunks.size()),
                                           c.whole.shape.num_heads, c.whole.shape.num_kv_heads, D};
          Forward cpu_merged = nothing_seen(query_shape);
          for (size_t kb = 0; kb < key_blocks.size(); ++kb) {
            const BlockCall call = block_call(c, o, query_chunks, key_blocks[kb]);
            const AttentionShape& s = call.shape;
            const int64_t Tk = call.keys.per_window;
            SCOPED_TRACE(option_name(precision) + " " + c.whole.name +
                         (dropout > 0.0 ? " with dropout" : "") + ", query chunks " +
                         ::testing::PrintToString(query_chunks) + ", key chunks " +
                         ::testing::PrintToString(key_blocks[kb]));
            const Forward cpu = block_forward(*pair.cpu, call, o.dropout);
            const Forward gpu = block_forward(*pair.gpu, call, o.dropout);
            const EmptyRows cpu_empty = empty_rows(cpu, s), gpu_empty = empty_rows(gpu, s);
            EXPECT_EQ(gpu_empty.rows, cpu_empty.rows) << "rows that see no key of the block";
            EXPECT_EQ(gpu_empty.nonzero_out, 0);
            EXPECT_EQ(cpu_empty.nonzero_out, 0);
            const auto rows = static_cast<int64_t>(cpu_empty.rows.size());
            blocks_some_rows_empty += cpu_empty.count > 0 && cpu_empty.count < rows;
            blocks_all_rows_empty += cpu_empty.count == rows;
            EXPECT_GPU_MATCHES(finite_part(gpu.lse), finite_part(cpu.lse),
                               tolerance(precision, Tk + D, false));
            EXPECT_GPU_MATCHES(gpu.out, cpu.out, tolerance(precision, Tk + D, bf16));
            if (static_cast<int64_t>(kb) >= chunks) continue;  // merged: the single chunks, in order
            // A two-term sum per entry; a row at -inf on one side takes the other side's bits.
            const Forward cpu_next = merged(*pair.cpu, s, cpu_merged, cpu);
            const Forward gpu_next = merged(*pair.gpu, s, cpu_merged, cpu);
            EXPECT_EQ(empty_rows(gpu_next, s).rows, empty_rows(cpu_next, s).rows);
            EXPECT_GPU_MATCHES(finite_part(gpu_next.lse), finite_part(cpu_next.lse),
                               tolerance(precision, 2, false));
            EXPECT_GPU_MATCHES(gpu_next.out, cpu_next.out, tolerance(precision, 2, bf16));
            int64_t unchanged_wrong = 0;
            for (size_t row = 0; row < cpu.lse.size(); ++row) {
              const bool block_empty = cpu_empty.rows[row],
                         before_empty = cpu_merged.lse[row] == -std::numeric_limits<double>::infinity();
              if (!block_empty && !before_empty) continue;
              const Forward& taken = block_empty ? cpu_merged : cpu;  // the side the row keeps
              unchanged_wrong += gpu_next.lse[row] != taken.lse[row];
              const int64_t i = static_cast<int64_t>(row) % s.seq,
                            h = static_cast<int64_t>(row) / s.seq % s.num_heads,
                            b = static_cast<int64_t>(row) / s.seq / s.num_heads;
              for (int64_t d = 0; d < D; ++d) {
                const size_t e = static_cast<size_t>((b * s.seq + i) * s.num_heads * D + h * D + d);
                unchanged_wrong += gpu_next.out[e] != taken.out[e];
              }
            }
            EXPECT_EQ(unchanged_wrong, 0) << "merge of a row at -inf on one side";
            cpu_merged = cpu_next;
          }
          for (const std::vector<int64_t>& key_chunks : key_blocks) {
            SCOPED_TRACE(option_name(precision) + " " + c.whole.name +
                         (dropout > 0.0 ? " with dropout" : "") + " backward, query chunks " +
                         ::testing::PrintToString(query_chunks) + ", key chunks " +
                         ::testing::PrintToString(key_chunks));
            const BlockCall call = block_call(c, o, query_chunks, key_chunks);
            const Backward cpu_grad = block_backward(*pair.cpu, call, o.dropout, cpu_merged);
            const Backward gpu_grad = block_backward(*pair.gpu, call, o.dropout, cpu_merged);
            // As in MatchesTheCpuReference, with Tk keys per query and Tq queries per key and head.
            const int64_t Tq = call.shape.seq, Tk = call.keys.per_window;
            EXPECT_GPU_MATCHES(gpu_grad.dq, cpu_grad.dq, tolerance(precision, Tk + D, bf16));
            EXPECT_GPU_MATCHES(gpu_grad.dk, cpu_grad.dk,
                               tolerance(precision, heads_per_group * Tq + D, bf16));
            EXPECT_GPU_MATCHES(gpu_grad.dv, cpu_grad.dv,
                               tolerance(precision, heads_per_group * Tq + D, bf16));
          }
        }
      }
    }
    SCOPED_TRACE(option_name(precision));
    EXPECT_GT(blocks_some_rows_empty, 0);  // rows that see no key of the block next to rows that do
    EXPECT_GT(blocks_all_rows_empty, 0);   // a block after every query
    const AttentionTileCount cpu_tiles = pair.cpu->attention_tiles(), gpu_tiles = pair.gpu->attention_tiles();
    EXPECT_EQ(gpu_tiles.computed, cpu_tiles.computed);
    EXPECT_EQ(gpu_tiles.skipped, cpu_tiles.skipped);
  }
}

// The blocks add up to the whole window, on the GPU in FP64: per query block, the forwards of the key
// chunks merged in order are the whole forward's rows, the block backwards' dq summed over the key
// chunks (from the whole forward's out and lse) are the whole dq's rows, and each key chunk's dk and dv
// summed over the query blocks are the whole dk's and dv's rows. The sums are the whole window's terms
// grouped differently (a block's result is rescaled once by the merge instead of tile by tile), so they
// agree to a few units of the last place: 1e-14 relative (measured: below 5e-16).
TEST(CudaAttention, MergedBlocksAreTheWholeWindow) {
  const double regrouped = 1e-14;
  BackendPair pair(Precision::kFp64);
  Backend& gpu = *pair.gpu;
  for (const BlockCase& c : block_cases()) {
    const AttentionShape& s = c.whole.shape;
    const int64_t T = s.seq, D = s.head_dim, chunks = T / c.chunk;
    for (const double dropout : {0.0, 0.25}) {
      SCOPED_TRACE(c.whole.name + (dropout > 0.0 ? " with dropout" : ""));
      const Operands o = operands(c.whole, Precision::kFp64, dropout);
      const Forward whole = forward(gpu, c.whole, o);
      const Backward whole_grad = backward(gpu, c.whole, o, whole);
      std::vector<std::vector<double>> dk(static_cast<size_t>(chunks)), dv(static_cast<size_t>(chunks));
      for (const std::vector<int64_t>& query_chunks : c.queries) {
        const Rows queries = rows_at(c.whole, c.chunk, query_chunks);
        const AttentionShape block_shape{s.windows, queries.per_window, s.num_heads, s.num_kv_heads, D};
        Forward running = nothing_seen(block_shape);
        const Forward whole_rows{token_rows(whole.out, T, s.num_heads * D, queries),
                                 head_rows(whole.lse, s.num_heads, T, 1, queries)};
        std::vector<double> dq(static_cast<size_t>(s.windows * s.num_heads * queries.per_window * D), 0.0);
        for (int64_t k = 0; k < chunks; ++k) {
          const BlockCall call = block_call(c, o, query_chunks, {k});
          running = merged(gpu, block_shape, running, block_forward(gpu, call, o.dropout));
          const Backward g = block_backward(gpu, call, o.dropout, whole_rows);
          for (size_t e = 0; e < dq.size(); ++e) dq[e] += g.dq[e];
          std::vector<double>& dk_sum = dk[static_cast<size_t>(k)];
          std::vector<double>& dv_sum = dv[static_cast<size_t>(k)];
          if (dk_sum.empty()) {
            dk_sum.assign(g.dk.size(), 0.0);
            dv_sum.assign(g.dv.size(), 0.0);
          }
          for (size_t e = 0; e < g.dk.size(); ++e) {
            dk_sum[e] += g.dk[e];
            dv_sum[e] += g.dv[e];
          }
        }
        EXPECT_GPU_MATCHES(running.lse, whole_rows.lse, regrouped);
        EXPECT_GPU_MATCHES(running.out, whole_rows.out, regrouped);
        EXPECT_GPU_MATCHES(dq, head_rows(whole_grad.dq, s.num_heads, T, D, queries), regrouped);
      }
      for (int64_t k = 0; k < chunks; ++k) {
        const Rows keys = rows_at(c.whole, c.chunk, {k});
        EXPECT_GPU_MATCHES(dk[static_cast<size_t>(k)], head_rows(whole_grad.dk, s.num_kv_heads, T, D, keys),
                           regrouped);
        EXPECT_GPU_MATCHES(dv[static_cast<size_t>(k)], head_rows(whole_grad.dv, s.num_kv_heads, T, D, keys),
                           regrouped);
      }
    }
  }
}

}  // namespace

}  // namespace touchstone::gpu_testing
