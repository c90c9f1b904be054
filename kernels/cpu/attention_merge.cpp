// CPU merge of attention over blocks of keys (Backend::attention_merge), for context parallelism's
// blocks (kernels/cpu/attention.cpp computes each). A query's attention over keys split into blocks A
// and B is
//   lse = log(exp(lse_A) + exp(lse_B)),  O = exp(lse_A - lse) O_A + exp(lse_B - lse) O_B
// because O_X = sum_{j in X} exp(s_j - lse_X) v_j. In FP32 and BF16 modes the weights and sums are FP32
// and O is stored as an activation again (BF16 in BF16 mode). Threads (parallel_for.h) split the rows;
// each row's sums run in one task, so the bits do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel_for.h"

namespace touchstone {

namespace {

// One row of attention_merge: the block's (o_b, lse_b) into the running (o, lse), in compute type C.
template <typename C>
void merge_row(const cpu::Rounding& rounding, const double* block_out, double block_lse, int64_t D,
               double* out, double* lse) {
  const C a = static_cast<C>(*lse), b = static_cast<C>(block_lse);
  if (b == -std::numeric_limits<C>::infinity()) return;  // the block adds nothing
  if (a == -std::numeric_limits<C>::infinity()) {        // nothing before it: take the block's
    std::copy_n(block_out, D, out);
    *lse = block_lse;
    return;
  }
  const C m = std::max(a, b), merged = m + std::log(std::exp(a - m) + std::exp(b - m));
  const C wa = std::exp(a - merged), wb = std::exp(b - merged);
  for (int64_t d = 0; d < D; ++d) {
    out[d] = rounding.activation(
        static_cast<double>(wa * static_cast<C>(out[d]) + wb * static_cast<C>(block_out[d])));
  }
  *lse = static_cast<double>(merged);
}

}  // namespace

void CpuBackend::attention_merge(const double* block_out, const double* block_lse, const AttentionShape& s,
                                 double* out, double* lse) {
  const int64_t Tq = s.seq, D = s.head_dim, rows = s.windows * s.num_heads * Tq;
  const cpu::Rounding rounding{precision()};
  // Row (b, h, i) of lse[b,NH,Tq]; its output row is out[(b*Tq + i), h*D ...].
  cpu::parallel_for(rows, D, [&](int64_t row) {
    const int64_t i = row % Tq, h = row / Tq % s.num_heads, b = row / Tq / s.num_heads;
    const int64_t o = (b * Tq + i) * s.num_heads * D + h * D;
    if (precision() == Precision::kFp64) {
      merge_row<double>(rounding, block_out + o, block_lse[row], D, out + o, lse + row);
    } else {
      merge_row<float>(rounding, block_out + o, block_lse[row], D, out + o, lse + row);
    }
  });
}

}  // namespace touchstone
