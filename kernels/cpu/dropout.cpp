// CPU inverted dropout: the masks drawn from global coordinates, and the forward and backward of
// applying one.
//
// A mask element is a pure function of (the site's stream key, the window's global sample index, the
// element's index in that sample's global tensor) through uniform_at (common/rng.h; the formula is
// kernels/dropout_mask.h, which the attention kernels draw from tile by tile). A tensor-parallel
// shard of heads, a sequence-parallel block of rows or one micro-batch therefore draws exactly its
// slice of the one global mask, whatever the layout, and a resumed run draws the same masks again.
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel_for.h"
#include "kernels/dropout_mask.h"

namespace touchstone {

namespace {

// y[n] = x[n] * keep_scale[n] computed in T and stored as an activation.
template <typename T, typename R>
void multiply(const double* x, const double* keep_scale, int64_t n, double* y, const R& r) {
  cpu::parallel_for(n, 1, [&](int64_t i) {
    y[i] = r.activation(static_cast<double>(static_cast<T>(x[i]) * static_cast<T>(keep_scale[i])));
  });
}

}  // namespace

void CpuBackend::hidden_dropout_mask(const DropoutSite& site, int64_t first_row, int64_t rows, int64_t seq,
                                     int64_t hidden, double* keep_scale) {
  const double kept = dropout_kept_value(site.probability, rounding_);
  // Each element is a pure function of its coordinates, so the rows may be drawn in any order.
  cpu::parallel_for(rows, hidden, [&](int64_t r) {
    const int64_t row = first_row + r;  // in the micro-batch's N = b*T rows
    const int64_t window = row / seq, position = row % seq;
    for (int64_t c = 0; c < hidden; ++c) {
      keep_scale[r * hidden + c] =
          dropout_keep_scale(site, site.sample_indices[window], position * hidden + c, kept);
    }
  });
}

void CpuBackend::dropout_forward(const double* x, const double* keep_scale, int64_t n, double* y) {
  if (precision() == Precision::kFp64) {
    multiply<double>(x, keep_scale, n, y, cpu::NoRounding{});
  } else {
    multiply<float>(x, keep_scale, n, y, rounding_);
  }
}

void CpuBackend::dropout_backward(const double* dy, const double* keep_scale, int64_t n, double* dx) {
  // d(x * m) / dx = m: the gradient passes where the element was kept, scaled the same way.
  if (precision() == Precision::kFp64) {
    multiply<double>(dy, keep_scale, n, dx, cpu::NoRounding{});
  } else {
    multiply<float>(dy, keep_scale, n, dx, rounding_);
  }
}

}  // namespace touchstone
