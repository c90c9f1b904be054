// Philox4x32-10 and the coordinate-keyed uniform as inline functions that both the host and CUDA
// device code compile, so a dropout mask drawn on a GPU is the same bits as on the CPU (common/rng.h
// is the interface the rest of the code uses; common/rng.cpp forwards here).
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace touchstone::philox {

struct Block {
  uint32_t word[4];
};

TOUCHSTONE_HOST_DEVICE inline Block round_once(const Block& c, uint32_t key0, uint32_t key1) {
  const uint64_t product0 = static_cast<uint64_t>(0xD2511F53u) * c.word[0];
  const uint64_t product1 = static_cast<uint64_t>(0xCD9E8D57u) * c.word[2];
  const auto hi0 = static_cast<uint32_t>(product0 >> 32), lo0 = static_cast<uint32_t>(product0);
  const auto hi1 = static_cast<uint32_t>(product1 >> 32), lo1 = static_cast<uint32_t>(product1);
  return Block{{hi1 ^ c.word[1] ^ key0, lo1, hi0 ^ c.word[3] ^ key1, lo0}};
}

// Ten rounds; the key advances by the Weyl constants (golden ratio, sqrt(3) - 1) between rounds.
TOUCHSTONE_HOST_DEVICE inline Block rounds10(Block counter, uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += 0x9E3779B9u;
      key1 += 0xBB67AE85u;
    }
    counter = round_once(counter, key0, key1);
  }
  return counter;
}

// Uniform in (0, 1] with 53 random bits.
TOUCHSTONE_HOST_DEVICE inline double uniform_from_words(uint32_t high, uint32_t low) {
  const uint64_t bits53 = ((static_cast<uint64_t>(high) << 32) | low) >> 11;
  return (static_cast<double>(bits53) + 1.0) * 0x1.0p-53;  // never 0, so log() is finite
}

// Element `element` of global sample `sample`: counter = {block, sample} with block = element / 2;
// words (0,1) for an even element, (2,3) for an odd one.
TOUCHSTONE_HOST_DEVICE inline double uniform_at(uint32_t key0, uint32_t key1, uint64_t sample,
                                                uint64_t element) {
  const uint64_t block = element / 2;
  const Block words = rounds10(Block{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                      static_cast<uint32_t>(sample), static_cast<uint32_t>(sample >> 32)}},
                               key0, key1);
  return element % 2 == 0 ? uniform_from_words(words.word[0], words.word[1])
                          : uniform_from_words(words.word[2], words.word[3]);
}

}  // namespace touchstone::philox
