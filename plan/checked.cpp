// Checked arithmetic of the planners' quantities (checked.h).
#include "plan/checked.h"

#include <cmath>

#include "common/errors.h"
#include "plan/format.h"

namespace touchstone::plan {

int64_t checked_range(int64_t value, int64_t minimum, int64_t maximum, const std::string& what) {
  if (value < minimum || value > maximum) {
    throw InputError(what + ": must be in [" + std::to_string(minimum) + ", " + std::to_string(maximum) +
                     "], got " + std::to_string(value));
  }
  return value;
}

int64_t checked_product(std::initializer_list<int64_t> factors, int64_t maximum, const std::string& what) {
  int64_t product = 1;
  bool over = false;
  std::string written;
  for (const int64_t factor : factors) {
    written += (written.empty() ? "" : " x ") + std::to_string(factor);
    if (factor < 0) throw InputError(what + ": " + std::to_string(factor) + " is negative");
    // Once over, the product only grows (every factor is >= 1) or becomes 0: keep reading for the message.
    if (factor == 0) {
      product = 0;
      over = false;
      continue;
    }
    if (over || __builtin_mul_overflow(product, factor, &product) || product > maximum) over = true;
  }
  if (over) throw InputError(what + ": " + written + " is more than " + std::to_string(maximum));
  return product;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    throw InputError(what + ": " + std::to_string(a) + " + " + std::to_string(b) + " is beyond 64 bits");
  }
  return sum;
}

int64_t checked_integer(double value, int64_t minimum, int64_t maximum, const std::string& what) {
  if (!std::isfinite(value)) throw InputError(what + ": " + scientific(value) + " is not a finite number");
  const double rounded = std::round(value);
  const auto low = static_cast<double>(minimum), high = static_cast<double>(maximum);
  // INT64_MAX reads as the double 2^63, one past it: a value equal to that double does not convert.
  if (!(rounded >= low && rounded <= high) || (rounded == high && high >= 0x1p63)) {
    throw InputError(what + ": " + scientific(value) + " is outside [" + std::to_string(minimum) + ", " +
                     std::to_string(maximum) + "]");
  }
  return static_cast<int64_t>(rounded);
}

double checked_finite(double value, double maximum, const std::string& what) {
  if (!std::isfinite(value)) throw InputError(what + ": " + scientific(value) + " is not a finite number");
  if (value > maximum)
    throw InputError(what + ": " + scientific(value) + " is more than " + scientific(maximum));
  return value;
}

}  // namespace touchstone::plan
