// CUDA RMSNorm, RoPE, SwiGLU and the linear_qkv layout shuffle: forward and backward side by side, the
// device twin of kernels/cpu/normalization.cpp (same formulas, same rounding points; T is double in
// FP64 mode and float otherwise).
#include <cmath>
#include <vector>

#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/rope_angle.h"

namespace touchstone {

namespace {

// ---- RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) -------------------------------------

// One block per row n: x[N,H] -> y[N,H], rstd[N].
template <typename T>
__global__ void rmsnorm_forward_kernel(const double* x, const double* weight, int64_t hidden, double eps,
                                       cpu::Rounding r, double* y, double* rstd) {
  const int64_t n = blockIdx.x;
  const double* xn = x + n * hidden;
  T partial = 0;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    partial += static_cast<T>(xn[i]) * static_cast<T>(xn[i]);
  const T sum_squares = cuda::block_sum(partial);
  const T inv = T(1) / sqrt(sum_squares / static_cast<T>(hidden) + static_cast<T>(eps));
  if (threadIdx.x == 0) rstd[n] = static_cast<double>(inv);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    y[n * hidden + i] =
        r.activation(static_cast<double>(static_cast<T>(xn[i]) * inv * static_cast<T>(weight[i])));
  }
}

// One block per row: dx = rstd * (g - xhat * mean(g * xhat)) with xhat = x * rstd, g = dy * w.
template <typename T>
__global__ void rmsnorm_backward_dx_kernel(const double* dy, const double* x, const double* weight,
                                           const double* rstd, int64_t hidden, cpu::Rounding r, double* dx) {
  const int64_t n = blockIdx.x;
  const double* xn = x + n * hidden;
  const double* dyn = dy + n * hidden;
  const auto inv = static_cast<T>(rstd[n]);
  T partial = 0;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    partial += static_cast<T>(dyn[i]) * static_cast<T>(weight[i]) * static_cast<T>(xn[i]) * inv;
  }
  const T mean_g_xhat = cuda::block_sum(partial) / static_cast<T>(hidden);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const T xhat = static_cast<T>(xn[i]) * inv;
    dx[n * hidden + i] = r.activation(
        static_cast<double>(inv * (static_cast<T>(dyn[i]) * static_cast<T>(weight[i]) - xhat * mean_g_xhat)));
  }
}

// One thread per column i: dw_accum[i] += sum over rows n in ascending order of dy * xhat, the CPU's
// order, so no atomics are needed.
template <typename T>
__global__ void rmsnorm_backward_dw_kernel(const double* dy, const double* x, const double* rstd,
                                           int64_t rows, int64_t hidden, cpu::Rounding r,
                                           double* dweight_accum) {
  TOUCHSTONE_GRID_STRIDE_LOOP(i, hidden) {
    double g = dweight_accum[i];
    for (int64_t n = 0; n < rows; ++n) {
      const T xhat = static_cast<T>(x[n * hidden + i]) * static_cast<T>(rstd[n]);
      g = r.state(g + static_cast<double>(static_cast<T>(dy[n * hidden + i]) * xhat));
    }
    dweight_accum[i] = g;
  }
}

// ---- linear_qkv layout: per KV group g, rows [q heads of g | k_g | v_g], each D wide --------------------

// Where column c of a qkv row goes: which tensor (0 q, 1 k, 2 v), the head in it, and d.
struct QkvColumn {
  int which;
  int64_t head, d;
};

__device__ QkvColumn qkv_column(int64_t c, int64_t queries_per_group, int64_t head_dim) {
  const int64_t group_width = (queries_per_group + 2) * head_dim;
  const int64_t g = c / group_width, slot = (c % group_width) / head_dim, d = c % head_dim;
  if (slot < queries_per_group) return {0, g * queries_per_group + slot, d};
  return {slot == queries_per_group ? 1 : 2, g, d};
}

// split = true: qkv[N, (NH + 2 NKV) D] -> q[b,NH,T,D], k, v[b,NKV,T,D]; false: the inverse (merge).
__global__ void qkv_layout_kernel(bool split, AttentionShape s, double* qkv, double* q, double* k,
                                  double* v) {
  const int64_t width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
  const int64_t queries_per_group = s.num_heads / s.num_kv_heads;
  TOUCHSTONE_GRID_STRIDE_LOOP(i, s.windows * s.seq * width) {
    const int64_t row = i / width, b = row / s.seq, t = row % s.seq;
    const QkvColumn col = qkv_column(i % width, queries_per_group, s.head_dim);
    double* tensor = col.which == 0 ? q : col.which == 1 ? k : v;
    const int64_t heads = col.which == 0 ? s.num_heads : s.num_kv_heads;
    double& head_value = tensor[((b * heads + col.head) * s.seq + t) * s.head_dim + col.d];
    if (split) {
      head_value = qkv[i];
    } else {
      qkv[i] = head_value;
    }
  }
}

// ---- RoPE, rotate-half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) for pairs (i, i + D/2) ----------

// x[b, heads, T, D] in place; cos_sin[(b*T + t) * half + i] = (cos, sin) of the pair's angle, computed on
// the host in double exactly as the CPU reference computes it.
template <typename T>
__global__ void rope_kernel(double* x, const double2* cos_sin, int64_t windows, int64_t heads, int64_t seq,
                            int64_t head_dim, cpu::Rounding r) {
  const int64_t half = head_dim / 2;
  TOUCHSTONE_GRID_STRIDE_LOOP(e, windows * heads * seq * half) {
    const int64_t i = e % half, t = (e / half) % seq, h = (e / (half * seq)) % heads,
                  b = e / (half * seq * heads);
    const double2 angle = cos_sin[(b * seq + t) * half + i];
    const auto c = static_cast<T>(angle.x), sn = static_cast<T>(angle.y);
    double* xh = x + ((b * heads + h) * seq + t) * head_dim;
    const auto x1 = static_cast<T>(xh[i]), x2 = static_cast<T>(xh[i + half]);
    xh[i] = r.activation(static_cast<double>(x1 * c - x2 * sn));
    xh[i + half] = r.activation(static_cast<double>(x2 * c + x1 * sn));
  }
}

// ---- SwiGLU: act = silu(gate) * up, silu(g) = g * sigmoid(g) ------------------------------------------

template <typename T>
__global__ void swiglu_forward_kernel(const double* fc1, int64_t rows, int64_t ffn, cpu::Rounding r,
                                      double* act) {
  TOUCHSTONE_GRID_STRIDE_LOOP(e, rows * ffn) {
    const int64_t n = e / ffn, i = e % ffn;
    const auto g = static_cast<T>(fc1[n * 2 * ffn + i]), u = static_cast<T>(fc1[n * 2 * ffn + ffn + i]);
    const T sigmoid = T(1) / (T(1) + exp(-g));
    act[e] = r.activation(static_cast<double>(g * sigmoid * u));
  }
}

// d silu(g)/dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))); act as swiglu_forward_kernel computes it
template <typename T>
__global__ void swiglu_backward_kernel(const double* dact, const double* fc1, int64_t rows, int64_t ffn,
                                       cpu::Rounding r, double* dfc1, double* act) {
  TOUCHSTONE_GRID_STRIDE_LOOP(e, rows * ffn) {
    const int64_t n = e / ffn, i = e % ffn;
    const auto g = static_cast<T>(fc1[n * 2 * ffn + i]), u = static_cast<T>(fc1[n * 2 * ffn + ffn + i]);
    const auto d = static_cast<T>(dact[e]);
    const T sigmoid = T(1) / (T(1) + exp(-g));
    dfc1[n * 2 * ffn + i] =
        r.activation(static_cast<double>(d * u * sigmoid * (T(1) + g * (T(1) - sigmoid))));
    dfc1[n * 2 * ffn + ffn + i] = r.activation(static_cast<double>(d * g * sigmoid));
    act[e] = r.activation(static_cast<double>(g * sigmoid * u));
  }
}

}  // namespace

void CudaBackend::rmsnorm_forward(const double* x, const double* weight, int64_t rows, int64_t hidden,
                                  double eps, double* y, double* rstd) {
  if (rows == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_x = s.upload(x, rows * hidden);  // [N,H]
  const double* d_w = s.upload(weight, hidden);    // [H]
  double* d_y = s.output<double>(rows * hidden);   // [N,H]
  double* d_rstd = s.output<double>(rows);         // [N]
  const cuda::Launch launch = cuda::per_row(rows);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(rmsnorm_forward_kernel<decltype(compute)>, launch, stream_, d_x, d_w, hidden, eps,
                        rounding_, d_y, d_rstd);
  });
  cuda::check_launch("rmsnorm_forward");
  s.download(y, d_y, rows * hidden);
  s.download(rstd, d_rstd, rows);
  s.finish();
}

void CudaBackend::rmsnorm_backward(const double* dy, const double* x, const double* weight,
                                   const double* rstd, int64_t rows, int64_t hidden, double* dx,
                                   double* dweight_accum) {
  if (rows == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_dy = s.upload(dy, rows * hidden);  // [N,H]
  const double* d_x = s.upload(x, rows * hidden);    // [N,H]
  const double* d_w = s.upload(weight, hidden);      // [H]
  const double* d_rstd = s.upload(rstd, rows);       // [N]
  double* d_dx = s.output<double>(rows * hidden);    // [N,H]
  double* d_dw = s.upload(dweight_accum, hidden);    // [H]
  const cuda::Launch row_launch = cuda::per_row(rows), column_launch = cuda::per_element(hidden);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(rmsnorm_backward_dx_kernel<decltype(compute)>, row_launch, stream_, d_dy, d_x, d_w,
                        d_rstd, hidden, rounding_, d_dx);
    cuda::launch_kernel(rmsnorm_backward_dw_kernel<decltype(compute)>, column_launch, stream_, d_dy, d_x,
                        d_rstd, rows, hidden, rounding_, d_dw);
  });
  cuda::check_launch("rmsnorm_backward");
  s.download(dx, d_dx, rows * hidden);
  s.download(dweight_accum, d_dw, hidden);
  s.finish();
}

void CudaBackend::qkv_split(const double* qkv, const AttentionShape& shape, double* q, double* k, double* v) {
  const int64_t width = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim;
  const int64_t rows = shape.windows * shape.seq, D = shape.head_dim;
  if (rows == 0) return;
  cuda::Staging& s = begin_call();
  double* d_qkv = s.upload(qkv, rows * width);                    // [N, (NH + 2 NKV) D]
  double* d_q = s.output<double>(rows * shape.num_heads * D);     // [b,NH,T,D]
  double* d_k = s.output<double>(rows * shape.num_kv_heads * D);  // [b,NKV,T,D]
  double* d_v = s.output<double>(rows * shape.num_kv_heads * D);  // [b,NKV,T,D]
  const cuda::Launch launch = cuda::per_element(rows * width);
  cuda::launch_kernel(qkv_layout_kernel, launch, stream_, true, shape, d_qkv, d_q, d_k, d_v);
  cuda::check_launch("qkv_split");
  s.download(q, d_q, rows * shape.num_heads * D);
  s.download(k, d_k, rows * shape.num_kv_heads * D);
  s.download(v, d_v, rows * shape.num_kv_heads * D);
  s.finish();
}

void CudaBackend::qkv_merge(const double* dq, const double* dk, const double* dv, const AttentionShape& shape,
                            double* dqkv) {
  const int64_t width = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim;
  const int64_t rows = shape.windows * shape.seq, D = shape.head_dim;
  if (rows == 0) return;
  cuda::Staging& s = begin_call();
  double* d_q = s.upload(dq, rows * shape.num_heads * D);
  double* d_k = s.upload(dk, rows * shape.num_kv_heads * D);
  double* d_v = s.upload(dv, rows * shape.num_kv_heads * D);
  double* d_qkv = s.output<double>(rows * width);
  const cuda::Launch launch = cuda::per_element(rows * width);
  cuda::launch_kernel(qkv_layout_kernel, launch, stream_, false, shape, d_qkv, d_q, d_k, d_v);
  cuda::check_launch("qkv_merge");
  s.download(dqkv, d_qkv, rows * width);
  s.finish();
}

void CudaBackend::rope(double* x, const int32_t* position_ids, int64_t windows, int64_t heads, int64_t seq,
                       int64_t head_dim, double theta, bool inverse) {
  const int64_t half = head_dim / 2;
  if (windows * heads * seq * half == 0) return;
  // The angles on the host, as the CPU reference computes them (glibc's pow, cos and sin in double).
  std::vector<double> angles(static_cast<size_t>(windows * seq * half * 2));  // [b*T, half] of (cos, sin)
  const double direction = inverse ? -1.0 : 1.0;
  const std::vector<double> frequencies = rope_frequencies(head_dim, theta);
  for (int64_t bt = 0; bt < windows * seq; ++bt) {
    const auto pos = static_cast<double>(position_ids[bt]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = rope_angle(pos, frequencies[static_cast<size_t>(i)]);
      angles[static_cast<size_t>((bt * half + i) * 2)] = std::cos(angle);
      angles[static_cast<size_t>((bt * half + i) * 2 + 1)] = direction * std::sin(angle);
    }
  }
  cuda::Staging& s = begin_call();
  const int64_t n = windows * heads * seq * head_dim;
  double* d_x = s.upload(x, n);  // [b, heads, T, D]
  const auto* d_angles =
      reinterpret_cast<const double2*>(s.upload(angles.data(), static_cast<int64_t>(angles.size())));
  const cuda::Launch launch = cuda::per_element(windows * heads * seq * half);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(rope_kernel<decltype(compute)>, launch, stream_, d_x, d_angles, windows, heads, seq,
                        head_dim, rounding_);
  });
  cuda::check_launch("rope");
  s.download(x, d_x, n);
  s.finish();
}

void CudaBackend::swiglu_forward(const double* fc1, int64_t rows, int64_t ffn, double* act) {
  if (rows * ffn == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_fc1 = s.upload(fc1, rows * 2 * ffn);  // [N, 2F]
  double* d_act = s.output<double>(rows * ffn);         // [N, F]
  const cuda::Launch launch = cuda::per_element(rows * ffn);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(swiglu_forward_kernel<decltype(compute)>, launch, stream_, d_fc1, rows, ffn,
                        rounding_, d_act);
  });
  cuda::check_launch("swiglu_forward");
  s.download(act, d_act, rows * ffn);
  s.finish();
}

void CudaBackend::swiglu_backward(const double* dact, const double* fc1, int64_t rows, int64_t ffn,
                                  double* dfc1, double* act) {
  if (rows * ffn == 0) return;
  cuda::Staging& s = begin_call();
  const double* d_dact = s.upload(dact, rows * ffn);    // [N, F]
  const double* d_fc1 = s.upload(fc1, rows * 2 * ffn);  // [N, 2F]
  double* d_dfc1 = s.output<double>(rows * 2 * ffn);    // [N, 2F]
  double* d_act = s.output<double>(rows * ffn);         // [N, F]
  const cuda::Launch launch = cuda::per_element(rows * ffn);
  cuda::with_compute_type(precision(), [&](auto compute) {
    cuda::launch_kernel(swiglu_backward_kernel<decltype(compute)>, launch, stream_, d_dact, d_fc1, rows, ffn,
                        rounding_, d_dfc1, d_act);
  });
  cuda::check_launch("swiglu_backward");
  s.download(dfc1, d_dfc1, rows * 2 * ffn);
  s.download(act, d_act, rows * ffn);
  s.finish();
}

}  // namespace touchstone
