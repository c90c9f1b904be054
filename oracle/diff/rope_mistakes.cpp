// RoPE over adjacent pairs, and RoPE without its sine (see rope_mistakes.h). Serial loops: these run only
// when a diff looks for a signature, on the golden step's small batch.
#include "oracle/diff/rope_mistakes.h"

#include <cmath>
#include <vector>

#include "kernels/rope_angle.h"

namespace touchstone::diff {

std::string RopeMistakeBackend::name() const {
  return mistake_ == RopeMistake::kAdjacentPairs ? "cpu (RoPE over adjacent pairs)"
                                                 : "cpu (RoPE by its cosine only)";
}

void RopeMistakeBackend::rope(double* x, const int32_t* position_ids, int64_t windows, int64_t heads,
                              int64_t seq, int64_t head_dim, double theta, bool inverse) {
  const int64_t half = head_dim / 2;
  const double direction = inverse ? -1.0 : 1.0;
  const std::vector<double> frequencies = rope_frequencies(head_dim, theta);
  for (int64_t bt = 0; bt < windows * seq; ++bt) {
    const int64_t b = bt / seq, t = bt % seq;
    const double pos = static_cast<double>(position_ids[bt]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = rope_angle(pos, frequencies[static_cast<size_t>(i)]);
      const double c = std::cos(angle),
                   s = mistake_ == RopeMistake::kCosineOnly ? 0.0 : direction * std::sin(angle);
      // The pair's two elements: adjacent for the complex convention, half a head apart for rotate-half.
      const int64_t first = mistake_ == RopeMistake::kAdjacentPairs ? 2 * i : i;
      const int64_t second = mistake_ == RopeMistake::kAdjacentPairs ? 2 * i + 1 : i + half;
      for (int64_t h = 0; h < heads; ++h) {
        double* xh = x + ((b * heads + h) * seq + t) * head_dim;
        const double x1 = xh[first], x2 = xh[second];
        xh[first] = x1 * c - x2 * s;
        xh[second] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace touchstone::diff
