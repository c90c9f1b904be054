// CUDA attention against the CPU reference in every precision: the forward (out, lse) and the
// backward (dq, dk, dv) on shapes that reach the kernels' edges (T not a multiple of the 64-position
// tile, T = 1, single-token documents, all-padding windows, GQA, head_dim 6, several windows), with and
// without attention dropout; the tile pairs both backends count; the mask and the dropout drawn inside
// the kernels, exactly; and bitwise repeatability of two GPU calls.
#include <cmath>
#include <cstring>
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

}  // namespace

}  // namespace touchstone::gpu_testing
