// Writing the SVG charts and HTML pages that people read: a small writer that escapes every text and
// attribute value it is given (so no caller escapes anything, and no caller can forget to), formats
// coordinates with a fixed number of decimals, and a linear axis whose ticks fall on round steps. A
// document is written to its file with write_text_file_atomically (common/text_output.h), under the
// one output-path policy.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace touchstone::markup {

// `text` with & < > " ' replaced by their XML entities: safe as element text and as an attribute value.
std::string xml_escape(std::string_view text);

// `value` with exactly `decimals` digits after the point: "12.50" for (12.5, 2), "13" for (12.5, 0).
std::string fixed(double value, int decimals);
// `value` with at most `digits` significant digits and no trailing zeros (printf's %g): "0.25", "30",
// "1.5e-06".
std::string significant(double value, int digits);

// An attribute value: text (escaped when written), an integer (written as is) or a coordinate (written
// with the decimals of the document it goes into). Implicit, so that attribute lists read
// {{"x", 1.5}, {"width", 14}, {"fill", "#ffffff"}}.
class Value {
 public:
  Value(const char* text) : text_(text) {}
  Value(std::string text) : text_(std::move(text)) {}
  Value(int number) : text_(std::to_string(number)) {}
  Value(int64_t number) : text_(std::to_string(number)) {}
  Value(double coordinate) : coordinate_(coordinate), is_coordinate_(true) {}

  std::string format(int decimals) const;  // not yet escaped

 private:
  std::string text_;
  double coordinate_ = 0.0;
  bool is_coordinate_ = false;
};

struct Attribute {
  std::string_view name;
  Value value;
};
using Attributes = std::initializer_list<Attribute>;  // written in the order given

struct Point {
  double x = 0.0, y = 0.0;
};

// An SVG document built element by element, one element per line. Every shape may carry a tooltip (a
// <title> child, shown on hover).
class Svg {
 public:
  // `root` adds attributes to the <svg> element after width, height and viewBox (font-family, ...).
  Svg(Value width, Value height, Attributes root = {}, int decimals = 2);

  // The document's title (what a browser shows for it); the first element, by convention.
  Svg& title(std::string_view text);
  Svg& rect(Attributes attributes, std::string_view tooltip = {}) {
    return shape("rect", attributes, tooltip);
  }
  Svg& line(Attributes attributes, std::string_view tooltip = {}) {
    return shape("line", attributes, tooltip);
  }
  Svg& circle(Attributes attributes, std::string_view tooltip = {}) {
    return shape("circle", attributes, tooltip);
  }
  Svg& path(Attributes attributes, std::string_view tooltip = {}) {
    return shape("path", attributes, tooltip);
  }
  Svg& polyline(Attributes attributes) { return shape("polyline", attributes, {}); }
  Svg& text(Attributes attributes, std::string_view content);
  // Attributes shared by the elements up to end_group() (a stroke, a text anchor).
  Svg& group(Attributes attributes);
  Svg& end_group();

  // Path data and polyline points in this document's number format: "M1.00 2.00 L3.00 4.00" and
  // "1.00,2.00 3.00,4.00".
  std::string number(double coordinate) const { return fixed(coordinate, decimals_); }
  std::string path_through(const std::vector<Point>& points) const;
  std::string points(const std::vector<Point>& points) const;

  std::string str() const { return out_ + "</svg>\n"; }

 private:
  Svg& shape(std::string_view name, Attributes attributes, std::string_view tooltip);
  void start_tag(std::string_view name, Attributes attributes);  // "<name a="v"", left open
  void write_attributes(Attributes attributes);                  // ' a="v"' each

  int decimals_;
  std::string out_;
};

// A self-contained HTML page (inline style, nothing fetched), written in order. Text is escaped;
// raw() takes markup as is, for literal tags and an embedded SVG.
class Html {
 public:
  Html(std::string_view title, std::string_view style);

  Html& raw(std::string_view markup);
  Html& text(std::string_view text);
  // <name>text</name>, or <name class="css_class">text</name>.
  Html& element(std::string_view name, std::string_view text, std::string_view css_class = {});

  std::string str() const { return out_ + "</body></html>\n"; }

 private:
  std::string out_;
};

// A round axis tick step (1, 2, 2.5 or 5 times a power of ten) giving about `intervals` intervals over
// `span`.
double round_tick_step(double span, int intervals);

// A linear axis from 0 at a round step: ticks 0, step, 2 step, ... up to `span`, or, with
// round_up, up to `top`, the first tick at or above `span`, so that the axis ends on a tick.
struct LinearAxis {
  double step = 1.0;
  double top = 0.0;  // the axis's end: `span`, or with round_up a whole number of steps
  std::vector<double> ticks;
};
LinearAxis linear_axis(double span, int intervals, bool round_up = false);

}  // namespace touchstone::markup
