// Fuzzes the command lines of `touchstone plan memory | scaling | calendar` (tools/plan/plan_cli.h):
// the input is one argument per line after `touchstone plan`; a line "%%" ends the arguments, and what
// follows it is the content of a file that an argument FILE names (a scaling CSV for --csv, a config
// for --config). The arguments are parsed by the same CLI11 app (with the same integer-flag check) and
// run by the same planning code as the command, in process.
// Finding: a crash, sanitizer report, leak, hang or out-of-memory, an exception other than InputError
// or CLI11's parse errors (fuzz_input.h), or a number printed wrapped or undefined: a negative number
// where the report has none, "inf" or "nan".
#include <CLI/CLI.hpp>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "tools/cli/flag_values.h"
#include "tools/plan/plan_cli.h"

namespace {

// The arguments of the input, FILE replaced by the path of `file`. The one option that writes a file
// is the scaling chart's: an argument naming svg is dropped with its value, so that no input writes
// anywhere (a value that is not its option's reads as a stray argument, which CLI11 refuses anyway).
std::vector<std::string> arguments(const std::string& text, touchstone::fuzz::InputFile& file) {
  const size_t end = text.find("\n%%\n");
  const std::string head = text.substr(0, end);
  const std::string tail = end == std::string::npos ? "" : text.substr(end + 4);
  const std::string& path = file.write(reinterpret_cast<const uint8_t*>(tail.data()), tail.size());
  std::vector<std::string> args{"touchstone", "plan"};
  std::istringstream lines(head);
  bool skip_value = false;
  for (std::string line; std::getline(lines, line);) {
    if (skip_value) {
      skip_value = false;
      continue;
    }
    if (line.find("svg") != std::string::npos) {
      skip_value = line.find('=') == std::string::npos;
      continue;
    }
    args.push_back(line == "FILE" ? path : line);
  }
  return args;
}

// A number the planners print is a count, a size or a share, never negative: only a stage's free
// memory is ("-60.63  DOES NOT FIT"). "inf" and "nan" are an overflow or 0/0 that a check missed.
void expect_printed_numbers_defined(const std::string& out) {
  std::istringstream stream(out);
  std::vector<std::string> words;
  for (std::string word; stream >> word;) words.push_back(word);
  for (size_t i = 0; i < words.size(); ++i) {
    std::string w = words[i];  // "(-9,223,...)" -> "-9,223,...", "inf%" -> "inf", "1.78x" -> "1.78"
    while (!w.empty() && std::strchr("(~", w.front()) != nullptr) w.erase(0, 1);
    while (!w.empty() && std::strchr("),:;%x.", w.back()) != nullptr) w.pop_back();
    const bool negative = w.size() > 1 && w[0] == '-' && std::isdigit(static_cast<unsigned char>(w[1])) &&
                          !(i + 1 < words.size() && words[i + 1] == "DOES");
    const bool undefined = w == "inf" || w == "-inf" || w == "nan" || w == "-nan";
    if (negative || undefined) {
      std::fprintf(stderr, "finding: the plan printed \"%s\":\n%s\n", words[i].c_str(), out.c_str());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::InputFile file("plan-cli");
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> args = arguments(text, file);
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  std::ostringstream out;
  touchstone::fuzz::expect_input_errors_only([&] {
    CLI::App app{"touchstone"};
    app.require_subcommand(1);
    const auto plan = touchstone::plan::add_plan_commands(app);
    touchstone::check_integer_flags(app);  // as tools/cli/main.cpp does before it parses
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::Error&) {
      return;  // CLI11's refusal of the command line (exit status 2), or --help
    }
    if (plan->parsed()) plan->run(out);
  });
  expect_printed_numbers_defined(out.str());
  return 0;
}
