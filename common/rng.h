// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11, "Parallel random numbers: as easy
// as 1, 2, 3"), keyed by global coordinates.
//
// A value depends only on (seed, stream name, element index), never on how many values were drawn
// before it or by which process, so every parallel layout draws identical numbers for the same
// global element. Initial weights use the parameter name as the stream name.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace touchstone {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// The raw bijection: ten rounds of Philox4x32 (checked against the Random123 known-answer vectors).
PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// The key of a named stream: a 64-bit FNV-1a hash of the name mixed with the seed.
PhiloxKey stream_key(uint64_t seed, std::string_view stream_name);

// Uniform in (0, 1] with 53 random bits, from words (0,1) or (2,3) of one Philox block.
double uniform_from_words(uint32_t high, uint32_t low);

// Standard normal N(0, 1) for element `index` of the stream (Box-Muller on one Philox block).
double normal_at(PhiloxKey key, uint64_t index);

// Uniform in (0, 1] for element `element` of global sample `sample` of the stream (the dropout
// masks, docs/architecture.md "Dropout"). One Philox block serves two consecutive elements:
//   counter = {block low 32 bits, block high 32 bits, sample low 32 bits, sample high 32 bits},
//   block = element / 2; words (0,1) of the block for an even element, words (2,3) for an odd one.
double uniform_at(PhiloxKey key, uint64_t sample, uint64_t element);

}  // namespace touchstone
