// CPU RMSNorm, RoPE, SwiGLU and the linear_qkv layout shuffle: forward and backward side by side, each
// parallel over rows (tokens) by parallel_for.h's rule.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/exp_fp64.h"
#include "kernels/cpu/parallel_for.h"
#include "kernels/cpu/row_reductions.h"
#include "kernels/rope_angle.h"

namespace touchstone {

// ---- RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) -------------------------------------
// Statistics in T (FP32 unless FP64), summed by cpu::statistic_sum (row_reductions.h); outputs stored as
// activations, the weight gradient as state.

namespace {

template <typename T, typename R>
void rmsnorm_forward_impl(const double* x, const double* weight, int64_t rows, int64_t hidden, double eps,
                          double* y, double* rstd, const R& r) {
  cpu::parallel_for(rows, hidden, [&](int64_t n) {
    const double* xn = x + n * hidden;
    const T sum_squares = cpu::statistic_sum<T>(
        hidden, [xn](int64_t i) { return static_cast<T>(xn[i]) * static_cast<T>(xn[i]); });
    const T inv = T(1) / std::sqrt(sum_squares / static_cast<T>(hidden) + static_cast<T>(eps));
    rstd[n] = static_cast<double>(inv);
    for (int64_t i = 0; i < hidden; ++i) {
      y[n * hidden + i] =
          r.activation(static_cast<double>(static_cast<T>(xn[i]) * inv * static_cast<T>(weight[i])));
    }
  });
}

// The weight gradient's columns a block of rmsnorm_backward owns: each dweight element sums over the rows
// in row order inside one block, so no sum is split between threads (and the bits do not depend on the
// block's width). A block reads 2 KB of each row, its running sums on the stack.
constexpr int64_t kColumnBlock = 256;

template <typename T, typename R>
void rmsnorm_backward_impl(const double* dy, const double* x, const double* weight, const double* rstd,
                           int64_t rows, int64_t hidden, double* dx, double* dweight_accum, const R& r) {
  // With xhat = x * rstd and g = dy * w:  dx = rstd * (g - xhat * mean(g * xhat)),  dw += dy * xhat.
  cpu::parallel_for(rows, hidden, [&](int64_t n) {
    const double* xn = x + n * hidden;
    const double* dyn = dy + n * hidden;
    const auto inv = static_cast<T>(rstd[n]);
    const T mean_g_xhat = cpu::statistic_sum<T>(hidden,
                                                [&](int64_t i) {
                                                  return static_cast<T>(dyn[i]) * static_cast<T>(weight[i]) *
                                                         static_cast<T>(xn[i]) * inv;
                                                }) /
                          static_cast<T>(hidden);
    for (int64_t i = 0; i < hidden; ++i) {
      const T xhat = static_cast<T>(xn[i]) * inv;
      dx[n * hidden + i] = r.activation(static_cast<double>(
          inv * (static_cast<T>(dyn[i]) * static_cast<T>(weight[i]) - xhat * mean_g_xhat)));
    }
  });
  cpu::parallel_for((hidden + kColumnBlock - 1) / kColumnBlock, rows * kColumnBlock, [&](int64_t block) {
    const int64_t begin = block * kColumnBlock, width = std::min(hidden, begin + kColumnBlock) - begin;
    double sums[kColumnBlock];  // dweight_accum[begin, begin + width)
    std::copy_n(dweight_accum + begin, width, sums);
    for (int64_t n = 0; n < rows; ++n) {
      const double* xn = x + n * hidden + begin;
      const double* dyn = dy + n * hidden + begin;
      const auto inv = static_cast<T>(rstd[n]);
      for (int64_t i = 0; i < width; ++i) {
        const T xhat = static_cast<T>(xn[i]) * inv;
        sums[i] = r.state(sums[i] + static_cast<double>(static_cast<T>(dyn[i]) * xhat));
      }
    }
    std::copy_n(sums, width, dweight_accum + begin);
  });
}

}  // namespace

void CpuBackend::rmsnorm_forward(const double* x, const double* weight, int64_t rows, int64_t hidden,
                                 double eps, double* y, double* rstd) {
  if (precision() == Precision::kFp64) {
    rmsnorm_forward_impl<double>(x, weight, rows, hidden, eps, y, rstd, cpu::NoRounding{});
  } else {
    rmsnorm_forward_impl<float>(x, weight, rows, hidden, eps, y, rstd, rounding_);
  }
}

void CpuBackend::rmsnorm_backward(const double* dy, const double* x, const double* weight, const double* rstd,
                                  int64_t rows, int64_t hidden, double* dx, double* dweight_accum) {
  if (precision() == Precision::kFp64) {
    rmsnorm_backward_impl<double>(dy, x, weight, rstd, rows, hidden, dx, dweight_accum, cpu::NoRounding{});
  } else {
    rmsnorm_backward_impl<float>(dy, x, weight, rstd, rows, hidden, dx, dweight_accum, rounding_);
  }
}

// ---- linear_qkv layout: per KV group g, rows [q heads of g | k_g | v_g], each D wide --------------------

namespace {

// Calls visit(row offset of the head in qkv, which tensor (0 q, 1 k, 2 v), head index in that tensor)
// for every head in the grouped order.
template <typename Visit>
void for_each_qkv_head(const AttentionShape& s, Visit visit) {
  const int64_t queries_per_group = s.num_heads / s.num_kv_heads;
  int64_t offset = 0;
  for (int64_t g = 0; g < s.num_kv_heads; ++g) {
    for (int64_t j = 0; j < queries_per_group; ++j, offset += s.head_dim)
      visit(offset, 0, g * queries_per_group + j);
    visit(offset, 1, g);
    offset += s.head_dim;
    visit(offset, 2, g);
    offset += s.head_dim;
  }
}

}  // namespace

// Both copy one token row (b, t) per parallel_for index: pure copies, so any split gives the same bits.
void CpuBackend::qkv_split(const double* qkv, const AttentionShape& s, double* q, double* k, double* v) {
  const int64_t width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, D = s.head_dim;
  cpu::parallel_for(s.windows * s.seq, width, [&](int64_t row) {
    const int64_t b = row / s.seq, t = row % s.seq;
    for_each_qkv_head(s, [&](int64_t offset, int which, int64_t head) {
      double* dst = which == 0 ? q : which == 1 ? k : v;
      const int64_t heads = which == 0 ? s.num_heads : s.num_kv_heads;
      const double* src = qkv + row * width + offset;
      double* out = dst + ((b * heads + head) * s.seq + t) * D;
      for (int64_t d = 0; d < D; ++d) out[d] = src[d];
    });
  });
}

void CpuBackend::qkv_merge(const double* dq, const double* dk, const double* dv, const AttentionShape& s,
                           double* dqkv) {
  const int64_t width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, D = s.head_dim;
  cpu::parallel_for(s.windows * s.seq, width, [&](int64_t row) {
    const int64_t b = row / s.seq, t = row % s.seq;
    for_each_qkv_head(s, [&](int64_t offset, int which, int64_t head) {
      const double* src_tensor = which == 0 ? dq : which == 1 ? dk : dv;
      const int64_t heads = which == 0 ? s.num_heads : s.num_kv_heads;
      const double* src = src_tensor + ((b * heads + head) * s.seq + t) * D;
      double* out = dqkv + row * width + offset;
      for (int64_t d = 0; d < D; ++d) out[d] = src[d];
    });
  });
}

// ---- RoPE, rotate-half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) for pairs (i, i + D/2) ----------
// Angles in double (like a precomputed table), the rotation in T, the result stored as an activation.

namespace {

template <typename T, typename R>
void rope_impl(double* x, const int32_t* position_ids, int64_t windows, int64_t heads, int64_t seq,
               int64_t head_dim, double theta, bool inverse, const R& r) {
  const int64_t half = head_dim / 2;
  const double direction = inverse ? -1.0 : 1.0;  // the backward rotates gradients back by -angle
  const std::vector<double> frequencies = rope_frequencies(head_dim, theta);
  // One token (b, t) per index: it rotates that token's pairs in every head.
  cpu::parallel_for(windows * seq, heads * head_dim, [&](int64_t bt) {
    const int64_t b = bt / seq, t = bt % seq;
    const double pos = static_cast<double>(position_ids[bt]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = rope_angle(pos, frequencies[static_cast<size_t>(i)]);
      const auto c = static_cast<T>(std::cos(angle));
      const auto s = static_cast<T>(direction * std::sin(angle));
      for (int64_t h = 0; h < heads; ++h) {
        double* xh = x + ((b * heads + h) * seq + t) * head_dim;
        const auto x1 = static_cast<T>(xh[i]), x2 = static_cast<T>(xh[i + half]);
        xh[i] = r.activation(static_cast<double>(x1 * c - x2 * s));
        xh[i + half] = r.activation(static_cast<double>(x2 * c + x1 * s));
      }
    }
  });
}

// ---- SwiGLU: act = silu(gate) * up, silu(g) = g * sigmoid(g) ------------------------------------------

template <typename T, typename R>
void swiglu_forward_impl(const double* fc1, int64_t rows, int64_t ffn, double* act, const R& r) {
  cpu::parallel_for(rows, ffn, [&](int64_t n) {
    const double* gate = fc1 + n * 2 * ffn;
    const double* up = gate + ffn;
    double* out = act + n * ffn;  // exp(-g) first, then silu(g) * up
    for (int64_t i = 0; i < ffn; ++i) out[i] = static_cast<double>(-static_cast<T>(gate[i]));
    cpu::exp_in_place<T>(out, ffn);
    for (int64_t i = 0; i < ffn; ++i) {
      const auto g = static_cast<T>(gate[i]);
      const T sigmoid = T(1) / (T(1) + static_cast<T>(out[i]));
      out[i] = r.activation(static_cast<double>(g * sigmoid * static_cast<T>(up[i])));
    }
  });
}

template <typename T, typename R>
void swiglu_backward_impl(const double* dact, const double* fc1, int64_t rows, int64_t ffn, double* dfc1,
                          double* act, const R& r) {
  // d silu(g)/dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))); act as swiglu_forward_impl computes it
  cpu::parallel_for(rows, ffn, [&](int64_t n) {
    const double* gate = fc1 + n * 2 * ffn;
    const double* up = gate + ffn;
    double* dgate = dfc1 + n * 2 * ffn;  // exp(-g) first, then the gate's gradient
    double* dup = dgate + ffn;
    for (int64_t i = 0; i < ffn; ++i) dgate[i] = static_cast<double>(-static_cast<T>(gate[i]));
    cpu::exp_in_place<T>(dgate, ffn);
    for (int64_t i = 0; i < ffn; ++i) {
      const auto g = static_cast<T>(gate[i]), u = static_cast<T>(up[i]),
                 d = static_cast<T>(dact[n * ffn + i]);
      const T sigmoid = T(1) / (T(1) + static_cast<T>(dgate[i]));
      dgate[i] = r.activation(static_cast<double>(d * u * sigmoid * (T(1) + g * (T(1) - sigmoid))));
      dup[i] = r.activation(static_cast<double>(d * g * sigmoid));
      act[n * ffn + i] = r.activation(static_cast<double>(g * sigmoid * u));  // after dact's element is read
    }
  });
}

}  // namespace

void CpuBackend::rope(double* x, const int32_t* position_ids, int64_t windows, int64_t heads, int64_t seq,
                      int64_t head_dim, double theta, bool inverse) {
  if (precision() == Precision::kFp64) {
    rope_impl<double>(x, position_ids, windows, heads, seq, head_dim, theta, inverse, cpu::NoRounding{});
  } else {
    rope_impl<float>(x, position_ids, windows, heads, seq, head_dim, theta, inverse, rounding_);
  }
}

void CpuBackend::swiglu_forward(const double* fc1, int64_t rows, int64_t ffn, double* act) {
  if (precision() == Precision::kFp64) {
    swiglu_forward_impl<double>(fc1, rows, ffn, act, cpu::NoRounding{});
  } else {
    swiglu_forward_impl<float>(fc1, rows, ffn, act, rounding_);
  }
}

void CpuBackend::swiglu_backward(const double* dact, const double* fc1, int64_t rows, int64_t ffn,
                                 double* dfc1, double* act) {
  if (precision() == Precision::kFp64) {
    swiglu_backward_impl<double>(dact, fc1, rows, ffn, dfc1, act, cpu::NoRounding{});
  } else {
    swiglu_backward_impl<float>(dact, fc1, rows, ffn, dfc1, act, rounding_);
  }
}

}  // namespace touchstone
