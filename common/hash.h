// FNV-1a, 64 bits: the one byte hash of the project. It names RNG streams (common/rng.cpp) and
// checksums checkpoint tensors and files (checkpoint/). Changing any single byte of the input always
// changes the hash (each step is a bijection of the state), which is what a corruption check needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace touchstone {

constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;

// Continues `hash` over `bytes` bytes at `data` (start with kFnv1aBasis).
inline uint64_t fnv1a64(const void* data, size_t bytes, uint64_t hash = kFnv1aBasis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;  // FNV prime
  }
  return hash;
}

// 16 lower-case hex digits, as checksums are stored and printed.
inline std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace touchstone
