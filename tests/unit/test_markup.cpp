// The SVG and HTML writer (common/markup.h): hostile text in attributes, text and tooltips comes out
// escaped, documents are well-formed, numbers follow the document's format, and axes tick at round
// steps.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "common/markup.h"

namespace touchstone::markup {
namespace {

const std::string kHostile = "</text><script>alert('x')</script> & \"q\" <b>";
const std::string kHostileEscaped =
    "&lt;/text&gt;&lt;script&gt;alert(&apos;x&apos;)&lt;/script&gt; &amp; &quot;q&quot; &lt;b&gt;";

bool is_entity_at(const std::string& xml, std::size_t at) {
  for (const char* entity : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}) {
    if (xml.compare(at, std::string(entity).size(), entity) == 0) return true;
  }
  return false;
}

// "" when `xml` is well-formed as far as these writers go (balanced tags, one root, quoted attribute
// values, no bare < > or & in text or values), else what is wrong. Stricter than XML about '>' in
// text, because the writer escapes it.
std::string xml_error(const std::string& xml) {
  std::vector<std::string> open;
  int roots = 0;
  for (std::size_t i = 0; i < xml.size(); ++i) {
    if (xml[i] == '&' && !is_entity_at(xml, i)) return "bare & at " + std::to_string(i);
    if (xml[i] == '>') return "bare > at " + std::to_string(i);
    if (xml[i] != '<') continue;
    std::size_t j = i + 1;
    const bool closing = j < xml.size() && xml[j] == '/';
    if (closing) ++j;
    const std::size_t name_start = j;
    while (j < xml.size() && (std::isalnum(static_cast<unsigned char>(xml[j])) || xml[j] == '-')) ++j;
    const std::string name = xml.substr(name_start, j - name_start);
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    while (j < xml.size() && xml[j] != '>' && xml[j] != '/') {  // attributes: name="value"
      if (xml[j] == ' ') {
        ++j;
        continue;
      }
      const std::size_t equals = xml.find('=', j);
      if (equals == std::string::npos || xml[equals + 1] != '"') return "unquoted attribute in <" + name;
      const std::size_t end = xml.find('"', equals + 2);
      if (end == std::string::npos) return "unterminated attribute in <" + name;
      for (std::size_t k = equals + 2; k < end; ++k) {
        if (xml[k] == '<' || xml[k] == '>' || (xml[k] == '&' && !is_entity_at(xml, k))) {
          return "bare " + std::string(1, xml[k]) + " in an attribute of <" + name;
        }
      }
      j = end + 1;
    }
    const bool self_closing = j < xml.size() && xml[j] == '/';
    if (self_closing) ++j;
    if (j >= xml.size() || xml[j] != '>') return "unterminated <" + name;
    if (closing) {
      if (open.empty() || open.back() != name) return "</" + name + "> closes nothing open";
      open.pop_back();
    } else {
      if (open.empty()) ++roots;
      if (!self_closing) open.push_back(name);
    }
    i = j;
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

TEST(Markup, EscapesTheFiveXmlCharacters) {
  EXPECT_EQ(xml_escape(kHostile), kHostileEscaped);
  EXPECT_EQ(xml_escape("plain text, 1.5 %"), "plain text, 1.5 %");
  EXPECT_EQ(xml_escape(""), "");
}

TEST(Markup, CheckerRejectsWhatItShould) {
  EXPECT_NE(xml_error("<a><b></a></b>"), "");
  EXPECT_NE(xml_error("<a x=\"1 & 2\"/>"), "");
  EXPECT_NE(xml_error("<a x=\"<\"/>"), "");
  EXPECT_NE(xml_error("<a>1 < 2</a>"), "");
  EXPECT_NE(xml_error("<a/><b/>"), "");
  EXPECT_EQ(xml_error("<a x=\"&quot;\"><b/>&amp;</a>"), "");
}

TEST(Markup, SvgWritesTheDocumentElementByElement) {
  Svg svg(200.0, 100, {{"font-family", "sans-serif"}, {"font-size", 12}}, 1);
  svg.title("chart");
  svg.rect({{"x", 1.25}, {"y", 0}, {"width", 14}, {"fill", "#ffffff"}});
  svg.group({{"stroke", "#dddddd"}});
  svg.line({{"x1", 2.0}, {"x2", 3.04}}, "a tooltip");
  svg.end_group();
  svg.text({{"x", -0.5}, {"text-anchor", "end"}}, "label");
  svg.path({{"d", svg.path_through({{1, 2}, {3.25, 4}})}});
  svg.polyline({{"points", svg.points({{1, 2}, {3, 4}})}});
  svg.circle({{"cx", int64_t{7}}, {"r", 3.5}});
  EXPECT_EQ(
      svg.str(),
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"200.0\" height=\"100\" viewBox=\"0 0 200.0 100\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<title>chart</title>\n"
      "<rect x=\"1.2\" y=\"0\" width=\"14\" fill=\"#ffffff\"/>\n"
      "<g stroke=\"#dddddd\">\n"
      "<line x1=\"2.0\" x2=\"3.0\"><title>a tooltip</title></line>\n"
      "</g>\n"
      "<text x=\"-0.5\" text-anchor=\"end\">label</text>\n"
      "<path d=\"M1.0 2.0 L3.2 4.0\"/>\n"
      "<polyline points=\"1.0,2.0 3.0,4.0\"/>\n"
      "<circle cx=\"7\" r=\"3.5\"/>\n"
      "</svg>\n");
  EXPECT_EQ(xml_error(svg.str()), "");
}

TEST(Markup, SvgEscapesHostileTextEverywhere) {
  Svg svg(10, 10, {{"font-family", kHostile}});
  svg.title(kHostile);
  svg.rect({{"class", kHostile}, {"x", 1.0}}, kHostile);
  svg.text({{"fill", kHostile}}, kHostile);
  svg.group({{"transform", kHostile}});
  svg.path({{"d", kHostile}}, kHostile);
  svg.end_group();
  const std::string out = svg.str();
  EXPECT_EQ(xml_error(out), "");
  EXPECT_EQ(out.find("<script"), std::string::npos);
  EXPECT_EQ(out.find("</text><"), std::string::npos);
  std::size_t escaped = 0;
  for (std::size_t at = out.find(kHostileEscaped); at != std::string::npos;
       at = out.find(kHostileEscaped, at + 1)) {
    ++escaped;
  }
  // The root's font-family, the title, the rect's class and tooltip, the text's fill and content, the
  // group's transform, the path's d and tooltip.
  EXPECT_EQ(escaped, 9u);
}

TEST(Markup, HtmlPageEscapesTextAndKeepsRawMarkup) {
  Html page("report <1>", "body{margin:0}");
  page.raw("<h1>").text(kHostile).raw("</h1>\n");
  page.element("td", kHostile, "l").element("li", "plain");
  page.raw("<div>").raw(Svg(1, 1).str()).raw("</div>");
  EXPECT_EQ(page.str(),
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>report &lt;1&gt;</title>"
            "<style>body{margin:0}</style></head><body>\n<h1>" +
                kHostileEscaped + "</h1>\n<td class=\"l\">" + kHostileEscaped +
                "</td><li>plain</li><div><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\" "
                "viewBox=\"0 0 1 1\">\n</svg>\n</div></body></html>\n");
}

TEST(Markup, FixedDecimals) {
  EXPECT_EQ(fixed(12.5, 2), "12.50");
  EXPECT_EQ(fixed(3.14159, 0), "3");
  EXPECT_EQ(fixed(-0.25, 1), "-0.2");  // printf rounds a binary tie to even
  EXPECT_EQ(Svg(1, 1, {}, 3).number(2.0 / 3.0), "0.667");
}

TEST(Markup, AxisTicksFallOnRoundSteps) {
  EXPECT_DOUBLE_EQ(round_tick_step(10, 8), 2.0);  // 1.25 per interval rounds up to 2
  EXPECT_DOUBLE_EQ(round_tick_step(0.009, 8), 0.002);
  EXPECT_DOUBLE_EQ(round_tick_step(180, 8), 25.0);
  EXPECT_DOUBLE_EQ(round_tick_step(400, 8), 50.0);
  EXPECT_DOUBLE_EQ(round_tick_step(70, 8), 10.0);

  const LinearAxis exact = linear_axis(10, 8);
  EXPECT_DOUBLE_EQ(exact.step, 2.0);
  EXPECT_DOUBLE_EQ(exact.top, 10.0);
  EXPECT_EQ(exact.ticks, (std::vector<double>{0, 2, 4, 6, 8, 10}));  // the end is a tick when it falls on one
  EXPECT_EQ(linear_axis(9, 8).ticks.back(), 8.0);                    // and is not passed otherwise

  const LinearAxis rounded = linear_axis(11, 5, /*round_up=*/true);
  EXPECT_DOUBLE_EQ(rounded.step, 2.5);
  EXPECT_DOUBLE_EQ(rounded.top, 12.5);
  EXPECT_EQ(rounded.ticks.size(), 6u);
  EXPECT_DOUBLE_EQ(rounded.ticks.back(), 12.5);

  // Tenths do not add up exactly in binary; the last tick is still there.
  const LinearAxis tenths = linear_axis(0.7, 7);
  EXPECT_EQ(tenths.ticks.size(), 8u);
}

}  // namespace
}  // namespace touchstone::markup
