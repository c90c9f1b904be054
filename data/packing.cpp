// Packs documents into training windows: the stream, the window cut, targets, positions and document ids
// exactly as docs/data.md and data/packing.h state them.
#include "data/packing.h"

#include <cstddef>
#include <limits>

#include "common/errors.h"
#include "common/hash.h"

namespace touchstone::data {
namespace {

// The concatenated documents with one EOS after each, and for every stream position the index of
// the document it belongs to (an EOS belongs to the document it ends).
struct Stream {
  std::vector<int32_t> tokens;
  std::vector<int32_t> document_ids;
};

Stream concatenate(const std::vector<Document>& documents, int32_t eos_token) {
  if (documents.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw InputError("data: too many documents (" + std::to_string(documents.size()) +
                     "); document ids must fit in int32");
  }
  size_t total = 0;
  for (const Document& document : documents) total += document.size() + 1;
  Stream stream;
  stream.tokens.reserve(total);
  stream.document_ids.reserve(total);
  for (size_t index = 0; index < documents.size(); ++index) {
    const auto document_id = static_cast<int32_t>(index);
    for (int32_t token : documents[index]) {
      stream.tokens.push_back(token);
      stream.document_ids.push_back(document_id);
    }
    stream.tokens.push_back(eos_token);
    stream.document_ids.push_back(document_id);
  }
  return stream;
}

void validate(const PackingOptions& options) {
  if (options.seq_length < 1) {
    throw InputError("model.seq_length (the window length) must be >= 1 (got " +
                     std::to_string(options.seq_length) + ")");
  }
}

}  // namespace

std::vector<Window> pack_documents(const std::vector<Document>& documents, const PackingOptions& options) {
  validate(options);
  const Stream stream = concatenate(documents, options.eos_token);
  const size_t length = stream.tokens.size();
  const auto window_length = static_cast<size_t>(options.seq_length);
  const size_t num_windows = (length + window_length - 1) / window_length;

  std::vector<Window> windows(num_windows);
  for (size_t w = 0; w < num_windows; ++w) {
    Window& window = windows[w];
    window.tokens.resize(window_length);
    window.targets.resize(window_length);
    window.position_ids.resize(window_length);
    window.document_ids.resize(window_length);
    for (size_t i = 0; i < window_length; ++i) {
      const size_t s = w * window_length + i;
      const bool is_padding = s >= length;
      window.tokens[i] = is_padding ? options.pad_token : stream.tokens[s];
      window.document_ids[i] = is_padding ? kPaddingDocument : stream.document_ids[s];

      // Any change of document id, padding included, restarts the count, and so does the window start:
      // a document continued from the previous window cannot see its earlier tokens.
      if (!options.document_masking) {
        window.position_ids[i] = static_cast<int32_t>(i);
      } else if (i == 0 || window.document_ids[i] != window.document_ids[i - 1]) {
        window.position_ids[i] = 0;
      } else {
        window.position_ids[i] = window.position_ids[i - 1] + 1;
      }

      // The target at the window's last position is the first token of the next window (the overlap).
      int32_t target = kIgnoreTarget;
      if (s + 1 < length) {
        target = stream.tokens[s + 1];
        const bool crosses_document = stream.document_ids[s + 1] != stream.document_ids[s];
        if (options.document_masking && crosses_document) target = kIgnoreTarget;
        if (!options.eos_loss && target == options.eos_token) target = kIgnoreTarget;
      }
      window.targets[i] = target;
    }
  }
  return windows;
}

std::string content_fingerprint(const std::vector<Window>& windows) {
  uint64_t hash = kFnv1aBasis;
  const auto add = [&hash](const std::vector<int32_t>& values) {
    for (const int32_t value : values) {
      const auto bits = static_cast<uint32_t>(value);
      const unsigned char bytes[4] = {static_cast<unsigned char>(bits), static_cast<unsigned char>(bits >> 8),
                                      static_cast<unsigned char>(bits >> 16),
                                      static_cast<unsigned char>(bits >> 24)};
      hash = fnv1a64(bytes, sizeof bytes, hash);
    }
  };
  for (const Window& window : windows) {
    add(window.tokens);
    add(window.targets);
    add(window.position_ids);
    add(window.document_ids);
  }
  return "fnv1a64:" + hex64(hash);
}

}  // namespace touchstone::data
