// Philox4x32-10 (common/philox.h), and the Box-Muller normal and the coordinate-keyed uniform built on it.
#include "common/rng.h"

#include <cmath>
#include <numbers>

#include "common/hash.h"
#include "common/philox.h"

namespace touchstone {

PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  const philox::Block out =
      philox::rounds10(philox::Block{{counter[0], counter[1], counter[2], counter[3]}}, key[0], key[1]);
  return {out.word[0], out.word[1], out.word[2], out.word[3]};
}

PhiloxKey stream_key(uint64_t seed, std::string_view stream_name) {
  const uint64_t hash = fnv1a64(stream_name.data(), stream_name.size());
  // splitmix64 finaliser on (hash + seed) so nearby seeds give unrelated keys.
  uint64_t z = hash + 0x9E3779B97F4A7C15ull * (seed + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return {static_cast<uint32_t>(z), static_cast<uint32_t>(z >> 32)};
}

double uniform_from_words(uint32_t high, uint32_t low) { return philox::uniform_from_words(high, low); }

double normal_at(PhiloxKey key, uint64_t index) {
  const PhiloxCounter block =
      philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u}, key);
  const double u1 = uniform_from_words(block[0], block[1]);
  const double u2 = uniform_from_words(block[2], block[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double uniform_at(PhiloxKey key, uint64_t sample, uint64_t element) {
  return philox::uniform_at(key[0], key[1], sample, element);
}

}  // namespace touchstone
