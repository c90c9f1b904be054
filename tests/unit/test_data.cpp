// Tests of the data rules: packing against hand-computed windows, the built-in acceptance set's
// layout, and every error path of the .jsonl reader.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "common/errors.h"
#include "data/packing.h"
#include "data/sources.h"

namespace touchstone::data {
namespace {

using Ints = std::vector<int32_t>;
constexpr int32_t X = kIgnoreTarget;
constexpr int32_t kEos = 1;
constexpr int32_t kPad = 0;

// Stream (T = 8, EOS = 1, padding = 0):
//   window 0: 5 6 7 1 | 8 9 10 1      documents 0 and 1; document 1's EOS is on the window edge
//   window 1: 11 12 ... 18            document 2, continued into window 2
//   window 2: 19 20 1 | 21 22 1 | 0 0 document 2's tail, document 3, two padding positions
const std::vector<Document> kSmallDocuments = {
    {5, 6, 7}, {8, 9, 10}, {11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, {21, 22}};

std::vector<Window> pack_small(bool document_masking, bool eos_loss) {
  PackingOptions options;
  options.seq_length = 8;
  options.eos_token = kEos;
  options.pad_token = kPad;
  options.document_masking = document_masking;
  options.eos_loss = eos_loss;
  return pack_documents(kSmallDocuments, options);
}

TEST(Packing, TokensAndDocumentIds) {
  const std::vector<Window> windows = pack_small(true, true);
  ASSERT_EQ(windows.size(), 3u);
  EXPECT_EQ(windows[0].tokens, (Ints{5, 6, 7, 1, 8, 9, 10, 1}));
  EXPECT_EQ(windows[1].tokens, (Ints{11, 12, 13, 14, 15, 16, 17, 18}));
  EXPECT_EQ(windows[2].tokens, (Ints{19, 20, 1, 21, 22, 1, 0, 0}));
  // Each EOS carries the id of the document it ends; a continued document keeps its id.
  EXPECT_EQ(windows[0].document_ids, (Ints{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(windows[1].document_ids, (Ints{2, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_EQ(windows[2].document_ids, (Ints{2, 2, 2, 3, 3, 3, -1, -1}));
}

TEST(Packing, MaskedTargetsAndPositions) {
  const std::vector<Window> windows = pack_small(true, true);
  // EOS inputs are untrained; window 0's last target (document 2's first token) crosses documents.
  EXPECT_EQ(windows[0].targets, (Ints{6, 7, 1, X, 9, 10, 1, X}));
  // The overlap: window 1's last target is window 2's first token.
  EXPECT_EQ(windows[1].targets, (Ints{12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(windows[2].targets, (Ints{20, 1, X, 22, 1, X, X, X}));
  EXPECT_EQ(windows[0].position_ids, (Ints{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(windows[1].position_ids, (Ints{0, 1, 2, 3, 4, 5, 6, 7}));
  // Document 2 continues from window 1 but restarts at 0; the padding run also counts from 0.
  EXPECT_EQ(windows[2].position_ids, (Ints{0, 1, 2, 0, 1, 2, 0, 1}));
}

TEST(Packing, UnmaskedTargetsAndPositions) {
  const std::vector<Window> windows = pack_small(false, true);
  // Without masking an EOS input predicts the next document's first token.
  EXPECT_EQ(windows[0].targets, (Ints{6, 7, 1, 8, 9, 10, 1, 11}));
  EXPECT_EQ(windows[1].targets, (Ints{12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(windows[2].targets, (Ints{20, 1, 21, 22, 1, X, X, X}));
  for (const Window& window : windows) EXPECT_EQ(window.position_ids, (Ints{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(windows[2].document_ids, (Ints{2, 2, 2, 3, 3, 3, -1, -1}));
}

TEST(Packing, EosLossOffIgnoresEosTargets) {
  std::vector<Window> windows = pack_small(true, false);
  EXPECT_EQ(windows[0].targets, (Ints{6, 7, X, X, 9, 10, X, X}));
  EXPECT_EQ(windows[2].targets, (Ints{20, X, X, 22, X, X, X, X}));
  windows = pack_small(false, false);
  EXPECT_EQ(windows[0].targets, (Ints{6, 7, X, 8, 9, 10, X, 11}));
  EXPECT_EQ(windows[2].targets, (Ints{20, X, 21, 22, X, X, X, X}));
}

TEST(Packing, ExactFitHasNoPaddingWindow) {
  PackingOptions options{.seq_length = 4, .eos_token = kEos, .pad_token = kPad};
  const std::vector<Window> windows = pack_documents({{5, 6, 7}, {8, 9, 10}}, options);
  ASSERT_EQ(windows.size(), 2u);
  EXPECT_EQ(windows[1].tokens, (Ints{8, 9, 10, 1}));
  EXPECT_EQ(windows[1].targets, (Ints{9, 10, 1, X}));  // the stream's final EOS has no next token
}

TEST(Packing, EmptyDocumentIsItsEos) {
  PackingOptions options{.seq_length = 4, .eos_token = kEos, .pad_token = kPad};
  const std::vector<Window> windows = pack_documents({{5}, {}, {6}}, options);
  ASSERT_EQ(windows.size(), 2u);
  EXPECT_EQ(windows[0].tokens, (Ints{5, 1, 1, 6}));
  EXPECT_EQ(windows[0].document_ids, (Ints{0, 0, 1, 2}));
  EXPECT_EQ(windows[0].targets, (Ints{1, X, X, 1}));
  EXPECT_EQ(windows[1].tokens, (Ints{1, 0, 0, 0}));
  EXPECT_EQ(windows[1].position_ids, (Ints{0, 0, 1, 2}));
}

TEST(Packing, NoDocumentsGiveNoWindows) {
  PackingOptions options{.seq_length = 4, .eos_token = kEos, .pad_token = kPad};
  EXPECT_TRUE(pack_documents({}, options).empty());
}

TEST(Packing, RejectsNonPositiveSeqLength) {
  PackingOptions options{.seq_length = 0, .eos_token = kEos, .pad_token = kPad};
  try {
    pack_documents({{5}}, options);
    FAIL() << "expected InputError";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("model.seq_length"), std::string::npos) << error.what();
  }
}

// ---- built-in acceptance set ----

SourceOptions builtin_options(int seq_length, int vocab_size = 256, int32_t eos = kEos, int32_t pad = kPad) {
  return SourceOptions{.source = "builtin:acceptance",
                       .vocab_size = vocab_size,
                       .seq_length = seq_length,
                       .eos_token = eos,
                       .pad_token = pad};
}

std::vector<Window> pack_builtin(const SourceOptions& source) {
  PackingOptions options{
      .seq_length = source.seq_length, .eos_token = source.eos_token, .pad_token = source.pad_token};
  return pack_documents(load_documents(source), options);
}

int count_loss_tokens(const Window& window) {
  int count = 0;
  for (int32_t target : window.targets) count += target != kIgnoreTarget ? 1 : 0;
  return count;
}

class BuiltinLayout : public ::testing::TestWithParam<int> {};

TEST_P(BuiltinLayout, ExercisesEveryRule) {
  const int t = GetParam();
  const std::vector<Window> windows = pack_builtin(builtin_options(t));
  ASSERT_EQ(windows.size(), 24u);

  std::vector<int> first_window, last_window, first_position, last_position;  // per document
  int padding = 0;
  for (int w = 0; w < 24; ++w) {
    for (int i = 0; i < t; ++i) {
      const int32_t id = windows[static_cast<size_t>(w)].document_ids[static_cast<size_t>(i)];
      if (id == kPaddingDocument) {
        ASSERT_EQ(w, 23) << "padding before the last window";
        ++padding;
        continue;
      }
      ASSERT_EQ(padding, 0) << "a document token after padding";
      const auto d = static_cast<size_t>(id);
      if (d == first_window.size()) {
        first_window.push_back(w);
        first_position.push_back(i);
        last_window.push_back(w);
        last_position.push_back(i);
      }
      ASSERT_EQ(d + 1, first_window.size()) << "document ids must be consecutive";
      last_window[d] = w;
      last_position[d] = i;
    }
  }
  EXPECT_GE(padding, t / 4);
  EXPECT_LT(padding, t);

  bool spans_two_windows = false, ends_on_edge = false, two_whole_in_step_one = false;
  std::vector<int> whole_documents_per_window(24, 0);
  for (size_t d = 0; d < first_window.size(); ++d) {
    spans_two_windows |= last_window[d] - first_window[d] >= 1;
    ends_on_edge |= last_position[d] == t - 1 && d + 1 < first_window.size() && last_window[d] < 23;
    if (first_window[d] == last_window[d]) ++whole_documents_per_window[static_cast<size_t>(first_window[d])];
  }
  for (int w = 0; w < 8; ++w)
    two_whole_in_step_one |= whole_documents_per_window[static_cast<size_t>(w)] >= 2;
  EXPECT_TRUE(spans_two_windows);
  EXPECT_TRUE(ends_on_edge);
  EXPECT_TRUE(two_whole_in_step_one);

  // Documents crossing micro-batch edges (windows 2j+1 and 2j+2), one of them a step edge.
  int across_micro_batch_edge = 0;
  bool across_step_edge = false;
  for (size_t d = 0; d < first_window.size(); ++d) {
    if (first_window[d] / 2 != last_window[d] / 2) ++across_micro_batch_edge;
    across_step_edge |= first_window[d] / 8 != last_window[d] / 8;
  }
  EXPECT_GE(across_micro_batch_edge, 3);
  EXPECT_TRUE(across_step_edge);

  // In every step the default micro-batches (2 windows) hold very different numbers of loss tokens: the
  // smallest at most 0.6 of the largest (a tiny run holds about 5/9 of a long document's 2T).
  for (int step = 0; step < 3; ++step) {
    std::vector<int> counts;
    for (int w = 8 * step; w < 8 * step + 8; w += 2) {
      counts.push_back(count_loss_tokens(windows[static_cast<size_t>(w)]) +
                       count_loss_tokens(windows[static_cast<size_t>(w + 1)]));
    }
    const int smallest = *std::min_element(counts.begin(), counts.end());
    const int largest = *std::max_element(counts.begin(), counts.end());
    EXPECT_LE(10 * smallest, 6 * largest) << "step " << step + 1;
    EXPECT_GE(largest, 2 * t - 1) << "step " << step + 1;  // a micro-batch of (nearly) one document
  }
}

INSTANTIATE_TEST_SUITE_P(SeqLengths, BuiltinLayout, ::testing::Values(16, 17, 32, 64, 100, 128, 512));

TEST(Builtin, TwentyFourWindowsForEverySeqLengthFrom16) {
  for (int t = 16; t <= 300; ++t) {
    EXPECT_EQ(pack_builtin(builtin_options(t)).size(), 24u) << "T = " << t;
  }
}

TEST(Builtin, DefaultLayoutAtSeqLength64) {
  const std::vector<Window> windows = pack_builtin(builtin_options(64));
  // The tiny run of micro-batch 0: documents of lengths 2, 2, 2, 3, ... from position 0.
  EXPECT_EQ(windows[0].document_ids[0], 0);
  EXPECT_EQ(windows[0].tokens[1], kEos);
  EXPECT_EQ(windows[0].targets[0], kEos);
  EXPECT_EQ(windows[0].targets[1], X);
  EXPECT_EQ(windows[0].document_ids[8], 3);  // the fourth document has two content tokens
  EXPECT_EQ(windows[0].tokens[8], kEos);
  EXPECT_EQ(windows[0].position_ids[8], 2);
  // 2T = 128 positions: 14 groups of 9 and one document of length 2, 57 documents ending on window 1's
  // last position; that EOS's target is masked.
  EXPECT_EQ(windows[1].document_ids[63], 56);
  EXPECT_EQ(windows[1].tokens[63], kEos);
  EXPECT_EQ(windows[1].targets[63], X);
  EXPECT_EQ(windows[2].document_ids[0], 57);  // the long document over windows 2-4
  EXPECT_EQ(windows[3].document_ids[63], 57);
  EXPECT_EQ(windows[3].position_ids[0], 0);
  EXPECT_EQ(windows[4].document_ids[31], 57);  // its EOS, mid-window 4
  EXPECT_EQ(windows[4].tokens[31], kEos);
  EXPECT_EQ(windows[5].targets[63], kEos);  // the overlap token: document 60's EOS
  EXPECT_EQ(windows[6].tokens[0], kEos);    // alone opens window 6
  EXPECT_EQ(windows[6].document_ids[0], 60);
  EXPECT_EQ(windows[9].tokens[63], kEos);  // the long document over windows 7-9 ends on the edge
  EXPECT_EQ(windows[9].document_ids[63], 66);
  EXPECT_EQ(windows[23].document_ids[31], 189);
  EXPECT_EQ(windows[23].document_ids[32], kPaddingDocument);

  // The loss-token counts of the table in data/builtin_acceptance.cpp (masking and eos_loss on).
  std::vector<int> counts;
  for (size_t w = 0; w < 24; w += 2)
    counts.push_back(count_loss_tokens(windows[w]) + count_loss_tokens(windows[w + 1]));
  EXPECT_EQ(counts, (std::vector<int>{71, 128, 125, 122, 127, 71, 125, 128, 125, 71, 128, 93}));
}

TEST(Builtin, ContentIsDeterministicAndAvoidsSpecialTokens) {
  for (const SourceOptions& options :
       {builtin_options(64), builtin_options(32, 10, 5, 7), builtin_options(16, 3, 2, 0)}) {
    const std::vector<Document> documents = builtin_acceptance_documents(options);
    EXPECT_EQ(documents, builtin_acceptance_documents(options));
    std::set<int32_t> distinct;
    for (const Document& document : documents) {
      ASSERT_FALSE(document.empty());
      for (int32_t token : document) {
        ASSERT_GE(token, 0);
        ASSERT_LT(token, options.vocab_size);
        ASSERT_NE(token, options.eos_token);
        ASSERT_NE(token, options.pad_token);
        distinct.insert(token);
      }
    }
    EXPECT_EQ(distinct.size(), static_cast<size_t>(options.vocab_size - 2));
  }
}

void expect_input_error(const std::function<void()>& call, const std::string& expected_substring) {
  try {
    call();
    ADD_FAILURE() << "expected InputError containing: " << expected_substring;
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find(expected_substring), std::string::npos)
        << "message: " << error.what() << "\nexpected to contain: " << expected_substring;
  }
}

TEST(Builtin, RejectsShortWindowsAndBadOptions) {
  expect_input_error([] { builtin_acceptance_documents(builtin_options(15)); }, "model.seq_length >= 16");
  expect_input_error([] { load_documents(builtin_options(64, 256, 300, 0)); },
                     "data.eos_token (300) must be in [0, model.vocab_size = 256)");
  expect_input_error([] { load_documents(builtin_options(64, 256, 1, -1)); }, "data.pad_token (-1)");
  expect_input_error([] { load_documents(builtin_options(64, 256, 1, 1)); },
                     "must differ from data.eos_token");
  SourceOptions unknown = builtin_options(64);
  unknown.source = "builtin:tiny";
  expect_input_error([&] { load_documents(unknown); }, "'builtin:tiny' (known: builtin:acceptance)");
}

// ---- .jsonl files ----

class Jsonl : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& contents) {
    const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
    std::ofstream(path, std::ios::binary) << contents;
    created_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const std::string& path : created_) std::remove(path.c_str());
  }

 private:
  std::vector<std::string> created_;
};

TEST_F(Jsonl, ReadsGoodFile) {
  const std::string path =
      write("good.jsonl", "{\"tokens\": [5, 6, 255]}\n{\"tokens\":[0]}\r\n{\"tokens\":[7, 1]}");
  const std::vector<Document> documents = read_jsonl_documents(path, 256);
  EXPECT_EQ(documents, (std::vector<Document>{{5, 6, 255}, {0}, {7, 1}}));

  SourceOptions options = builtin_options(64);
  options.source = path;
  EXPECT_EQ(load_documents(options), documents);
}

TEST_F(Jsonl, ReportsFileAndLine) {
  const std::string good = "{\"tokens\":[5]}\n";
  const auto error_in = [&](const std::string& name, const std::string& contents) {
    const std::string path = write(name, contents);
    return [path] { read_jsonl_documents(path, 256); };
  };
  expect_input_error(error_in("range.jsonl", good + good + "{\"tokens\":[5, 300]}\n"),
                     "range.jsonl:3: token id 300 is outside [0, 256)");
  expect_input_error(error_in("negative.jsonl", "{\"tokens\":[-1]}\n"),
                     "negative.jsonl:1: token id -1 is outside [0, 256)");
  expect_input_error(error_in("empty_doc.jsonl", good + "{\"tokens\":[]}\n"),
                     "empty_doc.jsonl:2: empty document");
  expect_input_error(error_in("malformed.jsonl", good + good + good + "{\"tokens\":[5,\n"),
                     "malformed.jsonl:4: malformed JSON (");
  expect_input_error(error_in("overflow.jsonl", "{\"tokens\":[4467e44674]}\n"),  // found by fuzz_jsonl
                     "overflow.jsonl:1: malformed JSON (");
  expect_input_error(error_in("no_key.jsonl", "{\"ids\":[5]}\n"),
                     "no_key.jsonl:1: expected an object with key \"tokens\"");
  expect_input_error(error_in("array.jsonl", "[5, 6]\n"),
                     "array.jsonl:1: expected an object with key \"tokens\"");
  expect_input_error(error_in("extra_key.jsonl", "{\"tokens\":[5], \"text\":\"hi\"}\n"),
                     "extra_key.jsonl:1: unknown key \"text\"");
  expect_input_error(error_in("not_array.jsonl", "{\"tokens\":5}\n"),
                     "not_array.jsonl:1: \"tokens\" must be an array of integers");
  expect_input_error(error_in("float.jsonl", good + "{\"tokens\":[5, 6.0]}\n"),
                     "float.jsonl:2: token 1 is not an integer (got 6.0)");
  expect_input_error(error_in("bool.jsonl", "{\"tokens\":[true]}\n"),
                     "bool.jsonl:1: token 0 is not an integer");
  expect_input_error(error_in("blank.jsonl", good + "\n" + good), "blank.jsonl:2: blank line");
  expect_input_error(error_in("empty.jsonl", ""), "empty.jsonl: file is empty");
  expect_input_error([] { read_jsonl_documents("/nonexistent/missing.jsonl", 256); },
                     "/nonexistent/missing.jsonl: cannot open file");
  expect_input_error([] { read_jsonl_documents(::testing::TempDir(), 256); }, ": cannot open file");
}

}  // namespace
}  // namespace touchstone::data
