// `touchstone export hf`: a golden file's parameters as a Hugging Face LlamaForCausalLM checkpoint, a
// directory holding config.json and model.safetensors that transformers' from_pretrained loads with no
// missing or unexpected key (docs/diffing.md, "Exporting to Hugging Face"). The two files are
// published as one (common/published_directory.h): a reader never sees a new config.json beside an old
// model.safetensors.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/config.h"

namespace touchstone::hf {

// The content of config.json for a run's config: LlamaForCausalLM's sizes, norm epsilon, RoPE base,
// tying, initializer range and token ids, "torch_dtype" "float64" for an FP64 run and "float32"
// otherwise (the golden file's parameter dtype), no biases, no dropout, no cache.
nlohmann::json llama_config(const Config& config);

// Throws InputError naming `where` and the config key when the HF Llama architecture cannot express the
// run: model.hidden_dropout > 0 (HF's Llama has no hidden dropout) or model.attention_dropout > 0
// (Touchstone's masks come from its own counter-based RNG, which no HF run reproduces).
void check_expressible(const Config& config, const std::string& where);

// Throws InputError ("OPTION DIR: why", or "OPTION DIR/config.json: why"; without OPTION when it is
// empty) when `dir` cannot receive an export: it is empty, a symbolic link or something other than a
// directory; it is missing and its parent is not a directory that can be written in; or config.json or
// model.safetensors inside it is something other than a regular file (a symbolic link, a FIFO, a
// directory), or another entry in it is not a regular file (the directory is replaced as a whole and
// only regular files are carried into the new one). The policy of common/text_output.h, with the link
// refused and only the last directory of the path created.
void check_export_directory(const std::string& dir, const std::string& option);

struct ExportSummary {
  std::string group;    // the golden group exported: "/params/init" or "/steps/<s>/params"
  int64_t tensors = 0;  // tensors in model.safetensors
  uint64_t bytes = 0;   // size of model.safetensors
};

// Exports the parameters of `golden_path` after update `step` (0: /params/init) into `dir`, created
// when missing (its parent must exist). Everything is checked first (the directory, the golden file's
// format, the step, the config, every dataset's shape and dtype); then model.safetensors is streamed one
// golden tensor at a time and config.json written into a fresh directory beside `dir` (holding links to
// the other files of `dir`), which then takes the place of `dir` in one system call. A failure or a
// signal before that removes the fresh directory and leaves `dir` as it was; after it, `dir` holds the
// new pair. Bad input is an InputError naming the path or key.
ExportSummary export_hf(const std::string& golden_path, const std::string& dir, int64_t step);

}  // namespace touchstone::hf
