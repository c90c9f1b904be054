// The SVG and HTML writers, escaping and axis ticks (see markup.h).
#include "common/markup.h"

#include <cmath>
#include <cstdio>

namespace touchstone::markup {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
  return buffer;
}

std::string significant(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*g", digits, value);
  return buffer;
}

std::string Value::format(int decimals) const {
  return is_coordinate_ ? fixed(coordinate_, decimals) : text_;
}

// ---- SVG ----

Svg::Svg(Value width, Value height, Attributes root, int decimals) : decimals_(decimals) {
  const std::string w = width.format(decimals), h = height.format(decimals);
  start_tag("svg", {{"xmlns", "http://www.w3.org/2000/svg"},
                    {"width", w},
                    {"height", h},
                    {"viewBox", "0 0 " + w + " " + h}});
  write_attributes(root);
  out_ += ">\n";
}

void Svg::start_tag(std::string_view name, Attributes attributes) {
  out_ += "<" + std::string(name);
  write_attributes(attributes);
}

void Svg::write_attributes(Attributes attributes) {
  for (const Attribute& attribute : attributes) {
    out_ += " " + std::string(attribute.name) + "=\"" + xml_escape(attribute.value.format(decimals_)) + "\"";
  }
}

Svg& Svg::title(std::string_view text) {
  out_ += "<title>" + xml_escape(text) + "</title>\n";
  return *this;
}

Svg& Svg::shape(std::string_view name, Attributes attributes, std::string_view tooltip) {
  start_tag(name, attributes);
  if (tooltip.empty()) {
    out_ += "/>\n";
  } else {
    out_ += "><title>" + xml_escape(tooltip) + "</title></" + std::string(name) + ">\n";
  }
  return *this;
}

Svg& Svg::text(Attributes attributes, std::string_view content) {
  start_tag("text", attributes);
  out_ += ">" + xml_escape(content) + "</text>\n";
  return *this;
}

Svg& Svg::group(Attributes attributes) {
  start_tag("g", attributes);
  out_ += ">\n";
  return *this;
}

Svg& Svg::end_group() {
  out_ += "</g>\n";
  return *this;
}

std::string Svg::path_through(const std::vector<Point>& points) const {
  std::string d;
  for (const Point& p : points) d += (d.empty() ? "M" : " L") + number(p.x) + " " + number(p.y);
  return d;
}

std::string Svg::points(const std::vector<Point>& points) const {
  std::string list;
  for (const Point& p : points) list += (list.empty() ? "" : " ") + number(p.x) + "," + number(p.y);
  return list;
}

// ---- HTML ----

Html::Html(std::string_view title, std::string_view style) {
  out_ = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + xml_escape(title) +
         "</title><style>" + std::string(style) + "</style></head><body>\n";
}

Html& Html::raw(std::string_view markup) {
  out_ += markup;
  return *this;
}

Html& Html::text(std::string_view text) {
  out_ += xml_escape(text);
  return *this;
}

Html& Html::element(std::string_view name, std::string_view text, std::string_view css_class) {
  out_ += "<" + std::string(name);
  if (!css_class.empty()) out_ += " class=\"" + xml_escape(css_class) + "\"";
  out_ += ">" + xml_escape(text) + "</" + std::string(name) + ">";
  return *this;
}

// ---- Axes ----

double round_tick_step(double span, int intervals) {
  const double raw = span / intervals;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double factor : {1.0, 2.0, 2.5, 5.0}) {
    if (factor * magnitude >= raw) return factor * magnitude;
  }
  return 10.0 * magnitude;
}

LinearAxis linear_axis(double span, int intervals, bool round_up) {
  LinearAxis axis;
  axis.step = round_tick_step(span, intervals);
  axis.top = round_up ? std::ceil(span / axis.step) * axis.step : span;
  // Half a step past a rounded top, a relative 1e-9 past an exact one: either way the sums of steps
  // below, which gather rounding error, still reach the last tick.
  const double last = round_up ? axis.top + axis.step / 2 : span * (1.0 + 1e-9);
  for (double tick = 0.0; tick <= last; tick += axis.step) axis.ticks.push_back(tick);
  return axis;
}

}  // namespace touchstone::markup
