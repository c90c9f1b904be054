// Philox4x32-10, and the Box-Muller normal and the coordinate-keyed uniform built on it.
#include "model/rng.h"

#include <cmath>
#include <numbers>

#include "model/hash.h"

namespace touchstone {

namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

PhiloxCounter round_once(const PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * c[0];
  const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * c[2];
  const auto hi0 = static_cast<uint32_t>(product0 >> 32), lo0 = static_cast<uint32_t>(product0);
  const auto hi1 = static_cast<uint32_t>(product1 >> 32), lo1 = static_cast<uint32_t>(product1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    counter = round_once(counter, key);
  }
  return counter;
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

double uniform_from_words(uint32_t high, uint32_t low) {
  const uint64_t bits53 = ((static_cast<uint64_t>(high) << 32) | low) >> 11;
  return (static_cast<double>(bits53) + 1.0) * 0x1.0p-53;  // never 0, so log() is finite
}

double normal_at(PhiloxKey key, uint64_t index) {
  const PhiloxCounter block =
      philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u}, key);
  const double u1 = uniform_from_words(block[0], block[1]);
  const double u2 = uniform_from_words(block[2], block[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double uniform_at(PhiloxKey key, uint64_t sample, uint64_t element) {
  const uint64_t block = element / 2;
  const PhiloxCounter words =
      philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                     static_cast<uint32_t>(sample), static_cast<uint32_t>(sample >> 32)},
                    key);
  return element % 2 == 0 ? uniform_from_words(words[0], words[1]) : uniform_from_words(words[2], words[3]);
}

}  // namespace touchstone
