// Formatting and parsing of planner quantities.
#include "plan/format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/errors.h"

namespace touchstone::plan {

namespace {

// printf's text of one double with a precision, however long: "%.2f" of 1e300 has 303 characters.
std::string printed(const char* format, int precision, double value) {
  const int length = std::snprintf(nullptr, 0, format, precision, value);
  std::string text(static_cast<size_t>(length) + 1, '\0');
  std::snprintf(text.data(), text.size(), format, precision, value);
  text.pop_back();
  return text;
}

}  // namespace

std::string fixed(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  // Scaling first makes a decimal tie (140.625 -> 14062.5) an exact binary tie, which std::round sends
  // away from zero; the result then prints without further rounding. From 2^52 on a double has no
  // fraction to round, and scaling it could overflow.
  const double rounded = std::abs(value) >= 0x1p52 ? value : std::round(value * scale) / scale;
  return printed("%.*f", decimals, rounded == 0.0 ? 0.0 : rounded);
}

std::string gigabytes(double bytes) { return fixed(bytes / 1e9, 2); }

std::string scientific(double value, int max_digits) {
  if (value == 0.0) return "0";
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (std::abs(value) < 1e4) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*g", std::min(max_digits, 6), value);
    return text;
  }
  char text[64];
  for (int precision = 1; precision <= max_digits; ++precision) {
    std::snprintf(text, sizeof text, "%.*e", precision - 1, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  // "7.8125e+09" -> "7.8125e9"
  std::string s = text;
  const size_t e = s.find('e');
  std::string mantissa = s.substr(0, e), exponent = s.substr(e + 1);
  const bool negative = exponent[0] == '-';
  exponent = exponent.substr(1);
  while (exponent.size() > 1 && exponent[0] == '0') exponent.erase(0, 1);
  return mantissa + "e" + (negative ? "-" : "") + exponent;
}

std::string grouped(double value) {
  // Printed from the double itself, never through an integer type: a count past 2^63 keeps its digits
  // instead of wrapping (a CSV value near 2^63 once printed as -9,223,...; found by fuzz_scaling_csv).
  const double whole = std::round(value);
  std::string digits = printed("%.*f", 0, std::abs(whole));
  if (!std::isfinite(whole)) return digits;
  for (auto i = static_cast<long long>(digits.size()) - 3; i > 0; i -= 3) {
    digits.insert(static_cast<size_t>(i), ",");
  }
  return (whole < 0 ? "-" : "") + digits;
}

std::string short_quantity(double value) {
  static const struct {
    double scale;
    const char* suffix;
  } kUnits[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}, {1, ""}};
  for (const auto& unit : kUnits) {
    if (std::abs(value) >= unit.scale || unit.scale == 1) {
      char text[64];
      std::snprintf(text, sizeof text, "%.3g%s", value / unit.scale, unit.suffix);
      return text;
    }
  }
  return "";
}

std::string percent(double fraction, int decimals) { return fixed(fraction * 100.0, decimals) + "%"; }

double parse_quantity(const std::string& text, const std::string& what) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  if (end == begin) throw InputError(what + ": \"" + text + "\" is not a number");
  const std::string suffix(end);
  double scale = 1.0;
  if (suffix == "k" || suffix == "K") {
    scale = 1e3;
  } else if (suffix == "M") {
    scale = 1e6;
  } else if (suffix == "B" || suffix == "G") {
    scale = 1e9;
  } else if (suffix == "T") {
    scale = 1e12;
  } else if (!suffix.empty()) {
    throw InputError(what + ": \"" + text + "\" has an unknown suffix \"" + suffix +
                     "\" (use k, M, B or G, T, or a plain number such as 1.6e6)");
  }
  const double value = number * scale;  // "1e308T" overflows here
  if (!std::isfinite(value)) throw InputError(what + ": \"" + text + "\" is not a finite number");
  return value + 0.0;  // -0 reads as 0: no quantity is negative zero
}

}  // namespace touchstone::plan
