// Number formatting and parsing shared by the planners: the printed digits are what the acceptance
// record compares, so rounding is fixed here once (half away from zero, as people round by hand).
#pragma once

#include <string>

namespace touchstone::plan {

// `value` with `decimals` digits after the point, rounded half away from zero: 140.625 -> "140.63"
// (printf's round-half-even on the binary value would print "140.62").
std::string fixed(double value, int decimals);

// Bytes as decimal gigabytes (1 GB = 1e9 bytes) with two decimals.
std::string gigabytes(double bytes);

// The shortest scientific form that reads back as `value` (at most `max_digits` significant digits),
// without '+' or leading exponent zeros: 7.8125e9, 5e11. Values below 1e4 print as plain numbers.
std::string scientific(double value, int max_digits = 17);

// A non-negative count with thousands separators, rounded to the nearest integer: 180,000.
std::string grouped(double value);

// A compact quantity with an SI-style suffix and at most 3 significant digits: 180000 -> "180k",
// 1.6e6 -> "1.6M", 1e13 -> "10T".
std::string short_quantity(double value);

// A fraction as a percentage with `decimals` digits: 0.8889 -> "89%".
std::string percent(double fraction, int decimals);

// Parses a quantity such as "10T", "1.6M", "500e9", "7.5B" or "512": an optional suffix k/K (1e3),
// M (1e6), B or G (1e9), T (1e12). Throws InputError naming `what` for anything else.
double parse_quantity(const std::string& text, const std::string& what);

}  // namespace touchstone::plan
