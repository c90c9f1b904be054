// The built-in acceptance set ("builtin:acceptance"): a fixed list of documents whose lengths are laid
// out relative to the window length T so that packing them exercises every data rule in the first
// steps of the default run, and fills exactly 24 windows (the default 3 steps x 8 windows) for any
// T >= 16.
//
// Lengths below include the appended EOS; "ends at e" means the document's EOS is stream position e-1,
// so window w = floor(position / T). Integer division throughout (T/4 means floor(T/4)).
//
//   doc  ends at          what it exercises
//   0    2T + T/2         a long document spanning windows 0-2: whole windows of one document, a
//                         continuation restarting its positions at 0, ending mid-window 2
//   1    4T               a document ending exactly on a window edge: its EOS is window 3's last token
//                         and that position's target (the next document's first token) is masked
//   2    + T/4            two short documents packed whole into window 4 (step 1 sees them), the first
//   3    + T/3            starting exactly at the window start
//   4    6T + 1           a medium document whose last content token is window 5's last position (its
//                         target, the EOS, is the overlap token) and whose EOS alone opens window 6
//   5    + 2              three tiny documents after that EOS in window 6: one content token,
//   6    + 3              two content tokens,
//   7    + T/8            and T/8 - 1 content tokens
//   8    + T/2 + 3        medium
//   9    + T              medium, about one window, straddling a window edge
//   10   + 3T + T/3       long, covering whole windows
//   11   + 3T/4           medium
//   12   + 2T + T/5       long
//   13   + T/2            medium
//   14   + T + T/6        medium
//   15   + 4T + T/7       long
//   16   + T/3 + 1        short
//   17   23T + T/2        the last, long document; window 23 ends with ceil(T/2) >= T/4 padding positions
//
// With T = 64 the stream holds 1504 tokens in 24 windows (32 padding positions). Windows hold different
// numbers of EOS tokens, so consecutive pairs of windows (the default micro-batches) hold different
// numbers of loss tokens.
//
// Token content: document k is an arithmetic progression modulo the number of usable ids (those that are
// neither eos_token nor pad_token), with start and stride from a fixed integer hash of k: learnable from
// context, different in every document, and identical on every platform (no std:: random engines).
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "data/sources.h"
#include "model/errors.h"

namespace touchstone::data {
namespace {

constexpr int kMinimumSeqLength = 16;
constexpr int kNumWindows = 24;
constexpr uint64_t kContentKey = 0x70c4'5107'e0ac'ce55ULL;

// splitmix64's finalizer: a well-mixed, portable function of a 64-bit input.
uint64_t splitmix64(uint64_t value) {
  value += 0x9e37'79b9'7f4a'7c15ULL;
  value = (value ^ (value >> 30)) * 0xbf58'476d'1ce5'e4b9ULL;
  value = (value ^ (value >> 27)) * 0x94d0'49bb'1331'11ebULL;
  return value ^ (value >> 31);
}

// Stream end positions (see the table above): each document ends where the next one starts.
std::vector<int64_t> document_ends(int64_t t) {
  const int64_t last_end = (kNumWindows - 1) * t + t / 2;
  std::vector<int64_t> ends = {2 * t + t / 2, 4 * t};
  const auto append = [&ends](int64_t length) { ends.push_back(ends.back() + length); };
  append(t / 4);
  append(t / 3);
  ends.push_back(6 * t + 1);
  for (int64_t length : {int64_t{2}, int64_t{3}, t / 8, t / 2 + 3, t, 3 * t + t / 3, 3 * t / 4, 2 * t + t / 5,
                         t / 2, t + t / 6, 4 * t + t / 7, t / 3 + 1}) {
    append(length);
  }
  ends.push_back(last_end);
  return ends;
}

// Maps r in [0, vocab_size - 2) onto the ids that are neither special token, in increasing order.
int32_t usable_id(int64_t r, int32_t low_special, int32_t high_special) {
  if (r >= low_special) ++r;
  if (r >= high_special) ++r;
  return static_cast<int32_t>(r);
}

}  // namespace

std::vector<Document> builtin_acceptance_documents(const SourceOptions& options) {
  if (options.seq_length < kMinimumSeqLength) {
    throw InputError("data.source builtin:acceptance needs model.seq_length >= " +
                     std::to_string(kMinimumSeqLength) + " (got " + std::to_string(options.seq_length) + ")");
  }
  const bool specials_valid = options.eos_token >= 0 && options.eos_token < options.vocab_size &&
                              options.pad_token >= 0 && options.pad_token < options.vocab_size &&
                              options.eos_token != options.pad_token;
  if (!specials_valid) {
    throw InputError(
        "data.source builtin:acceptance needs data.eos_token and data.pad_token to be distinct "
        "ids in [0, model.vocab_size)");
  }
  if (options.vocab_size < 3) {
    throw InputError("data.source builtin:acceptance needs model.vocab_size >= 3 (got " +
                     std::to_string(options.vocab_size) + ")");
  }

  const int32_t low_special = std::min(options.eos_token, options.pad_token);
  const int32_t high_special = std::max(options.eos_token, options.pad_token);
  const auto num_usable = static_cast<uint64_t>(options.vocab_size - 2);

  std::vector<Document> documents;
  int64_t start_position = 0;
  for (int64_t end_position : document_ends(options.seq_length)) {
    const auto content_length = static_cast<uint64_t>(end_position - start_position - 1);
    start_position = end_position;

    const uint64_t hash = splitmix64(kContentKey ^ static_cast<uint64_t>(documents.size()));
    const uint64_t first = hash % num_usable;
    // A zero stride would make the document constant; with one usable id there is no other choice.
    const uint64_t stride = num_usable > 1 ? 1 + (hash >> 32) % (num_usable - 1) : 0;
    Document document(content_length);
    for (uint64_t i = 0; i < content_length; ++i) {
      const auto r = static_cast<int64_t>((first + i * stride) % num_usable);
      document[i] = usable_id(r, low_special, high_special);
    }
    documents.push_back(std::move(document));
  }
  return documents;
}

}  // namespace touchstone::data
