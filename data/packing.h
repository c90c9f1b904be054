// Packing documents into fixed-length training windows (docs/data.md).
//
// Documents are concatenated into one token stream, each followed by the EOS token, and cut into
// windows of T tokens. Window w holds stream[w*T, (w+1)*T) and its targets are the next tokens,
// stream[w*T+1, (w+1)*T+1), so consecutive windows overlap by one token (Megatron-LM's samples).
// The tail of the last window is padding.
//
// Per position i of window w (s = w*T + i is its stream index):
//   tokens        stream[s], or pad_token past the stream end.
//   document_ids  index of the document in the input list (the EOS included), kept by a document that is
//                 continued into the next window; kPaddingDocument past the stream end.
//   position_ids  without document_masking: i. With it: 0 at the window start and wherever the document
//                 id changes, otherwise the previous position + 1 (Megatron-LM's --reset-position-ids).
//                 A run of padding counts as one more "document": its positions count 0, 1, 2, ...
//   targets       stream[s+1], or kIgnoreTarget where s+1 is past the stream end (so at every padding
//                 position and at the stream's final EOS), where the target token equals eos_token and
//                 eos_loss is false, and, with document_masking, where stream[s+1] belongs to another
//                 document (the position whose input is an EOS). Without document_masking that EOS
//                 position is trained to predict the next document's first token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace touchstone::data {

constexpr int32_t kIgnoreTarget = -100;   // target of a position that contributes no loss
constexpr int32_t kPaddingDocument = -1;  // document id of a padding position

// One training window; every vector has T entries.
struct Window {
  std::vector<int32_t> tokens;        // input token ids
  std::vector<int32_t> targets;       // next token, or kIgnoreTarget
  std::vector<int32_t> position_ids;  // RoPE positions
  std::vector<int32_t> document_ids;  // index of the document in the source, or kPaddingDocument
};

struct PackingOptions {
  int seq_length = 0;  // T
  int32_t eos_token = 0;
  int32_t pad_token = 0;
  bool eos_loss = true;          // positions whose target token is eos_token are trained
  bool document_masking = true;  // positions restart per document; no loss across documents
};

// A document is its token ids without the trailing EOS (the packer appends it).
using Document = std::vector<int32_t>;

// Throws InputError when seq_length < 1. An empty document packs as its EOS alone.
std::vector<Window> pack_documents(const std::vector<Document>& documents, const PackingOptions& options);

// The content fingerprint of a packed data set, "fnv1a64:" and 16 hex digits: FNV-1a 64 over every
// window in order, each its tokens, targets, position ids and document ids as little-endian int32. It
// covers exactly what the samples of a run read, so a checkpoint and the sample ledger can tell that a
// resumed run reads the same data, whatever its data.source is called (docs/checkpoints.md).
std::string content_fingerprint(const std::vector<Window>& windows);

}  // namespace touchstone::data
