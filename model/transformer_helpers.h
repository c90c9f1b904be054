// Helpers of the decoder's source files (transformer.cpp, layer_blocks.cpp, split_backward.cpp): buffers
// and the names of modules in trace sites.
#pragma once

#include <cstdint>
#include <string>

#include "common/activation_arena.h"

namespace touchstone::model {

inline ActivationBuffer buffer(int64_t n) { return ActivationBuffer(static_cast<size_t>(n)); }
// Frees the buffer at once (clear() would keep the capacity).
inline void release(ActivationBuffer& v) { ActivationBuffer().swap(v); }
// A module of decoder layer l by its Megatron-Core name, for trace sites.
inline std::string layer_module(int64_t l, const char* module) {
  return "decoder.layers." + std::to_string(l) + "." + module;
}

}  // namespace touchstone::model
