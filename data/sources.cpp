// Loading documents: dispatch between built-in sets and .jsonl files, and a strict .jsonl reader whose
// every error names the file and line so that the user can fix the data.
#include "data/sources.h"

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace touchstone::data {
namespace {

constexpr char kBuiltinPrefix[] = "builtin:";
constexpr char kAcceptanceSource[] = "builtin:acceptance";

void require_token_in_vocab(int64_t token, const std::string& key, int vocab_size) {
  if (token < 0 || token >= vocab_size) {
    throw InputError(key + " (" + std::to_string(token) +
                     ") must be in [0, model.vocab_size = " + std::to_string(vocab_size) + ")");
  }
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; the user needs only the rest.
std::string without_exception_tag(const std::string& message) {
  const size_t end_of_tag = message.find("] ");
  return end_of_tag == std::string::npos ? message : message.substr(end_of_tag + 2);
}

// A token element is accepted only if it is an integer in [0, vocab_size); floats such as 3.0 and
// booleans are rejected rather than converted, because they signal a broken tokenizer export.
int32_t parse_token(const nlohmann::json& element, size_t index, int vocab_size, const std::string& where) {
  if (!element.is_number_integer()) {
    throw InputError(where + "token " + std::to_string(index) + " is not an integer (got " + element.dump() +
                     ")");
  }
  const bool in_range = element.is_number_unsigned()
                            ? element.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                            : element.get<int64_t>() >= 0 && element.get<int64_t>() < vocab_size;
  if (!in_range) {
    throw InputError(where + "token id " + element.dump() + " is outside [0, " + std::to_string(vocab_size) +
                     ")");
  }
  return static_cast<int32_t>(element.get<int64_t>());
}

Document parse_line(const std::string& line, int vocab_size, const std::string& where) {
  if (line.empty()) throw InputError(where + "blank line (every line must be a {\"tokens\": [...]} object)");
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& error) {  // a syntax error, or a number out of double's range
    throw InputError(where + "malformed JSON (" + without_exception_tag(error.what()) + ")");
  }
  if (!object.is_object() || !object.contains("tokens")) {
    throw InputError(where + "expected an object with key \"tokens\"");
  }
  for (const auto& [key, value] : object.items()) {
    if (key != "tokens") throw InputError(where + "unknown key \"" + key + "\" (only \"tokens\" is allowed)");
  }
  const nlohmann::json& tokens = object["tokens"];
  if (!tokens.is_array()) throw InputError(where + "\"tokens\" must be an array of integers");
  if (tokens.empty()) throw InputError(where + "empty document");
  Document document;
  document.reserve(tokens.size());
  for (size_t index = 0; index < tokens.size(); ++index) {
    document.push_back(parse_token(tokens[index], index, vocab_size, where));
  }
  return document;
}

}  // namespace

std::vector<Document> read_jsonl_documents(const std::string& path, int vocab_size) {
  if (vocab_size < 1) {
    throw InputError(path + ": model.vocab_size must be >= 1 (got " + std::to_string(vocab_size) + ")");
  }
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored))
    throw InputError(path + ": cannot open file (a directory)");
  std::ifstream file(path);
  if (!file) throw InputError(path + ": cannot open file");

  std::vector<Document> documents;
  std::string line;
  size_t line_number = 0;
  while (std::getline(file, line)) {
    ++line_number;
    // Files written on Windows end lines with "\r\n"; the "\r" is not part of the JSON.
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string where = path + ":" + std::to_string(line_number) + ": ";
    documents.push_back(parse_line(line, vocab_size, where));
  }
  if (file.bad()) throw InputError(path + ": read error after line " + std::to_string(line_number));
  if (line_number == 0) throw InputError(path + ": file is empty");
  return documents;
}

std::vector<Document> load_documents(const SourceOptions& options) {
  require_token_in_vocab(options.eos_token, "data.eos_token", options.vocab_size);
  require_token_in_vocab(options.pad_token, "data.pad_token", options.vocab_size);
  if (options.eos_token == options.pad_token) {
    throw InputError("data.pad_token (" + std::to_string(options.pad_token) +
                     ") must differ from data.eos_token");
  }
  if (options.source.empty()) throw InputError("data.source must not be empty");
  if (options.source == kAcceptanceSource) return builtin_acceptance_documents(options);
  if (options.source.starts_with(kBuiltinPrefix)) {
    throw InputError("data.source: unknown built-in source '" + options.source +
                     "' (known: " + kAcceptanceSource + ")");
  }
  return read_jsonl_documents(options.source, options.vocab_size);
}

}  // namespace touchstone::data
