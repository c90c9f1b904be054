// Checked arithmetic of the planners' quantities: a product, a sum or a double turned into an integer
// that does not fit is refused with an InputError naming the quantity, never wrapped or rounded into a
// number the report would print as if it were true. Every integer the planners size a vector with, loop
// over or print goes through these.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace touchstone::plan {

// The largest integer a double holds exactly (2^53): token counts, windows and rates above it are no
// longer counts, only approximations of them, and are refused where a count is printed.
inline constexpr double kMaxExactCount = 9007199254740992.0;

// `value` itself, refusing one outside [minimum, maximum]: "--tp: must be in [1, 1048576], got 0".
int64_t checked_range(int64_t value, int64_t minimum, int64_t maximum, const std::string& what);

// The product of non-negative `factors`, refusing one above `maximum` without forming a product that
// overflows: "tp x cp x pp x dp: 4294967296 x 1 x 4294967296 x 1 is more than 1048576".
int64_t checked_product(std::initializer_list<int64_t> factors, int64_t maximum, const std::string& what);

// a + b, refusing a sum int64_t cannot hold.
int64_t checked_add(int64_t a, int64_t b, const std::string& what);

// `value` rounded to the nearest integer, refusing NaN, an infinity and a value outside [minimum,
// maximum] (which also keeps the conversion itself defined).
int64_t checked_integer(double value, int64_t minimum, int64_t maximum, const std::string& what);

// `value` itself, refusing NaN, an infinity and a value above `maximum`.
double checked_finite(double value, double maximum, const std::string& what);

}  // namespace touchstone::plan
