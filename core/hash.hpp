// 64-bit FNV-1a: the one hash behind template hashes, cache keys and blob checksums. Stable
// across builds and machines (cache rows written by one build are found by another).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moeblaze {

constexpr uint64_t kFnv1aOffsetBasis = 14695981039346656037ull;

// Hash of `size` bytes at `data`; `seed` continues an earlier hash (pass its result).
uint64_t fnv1a64(const void* data, size_t size, uint64_t seed = kFnv1aOffsetBasis);
inline uint64_t fnv1a64(std::string_view text, uint64_t seed = kFnv1aOffsetBasis) {
  return fnv1a64(text.data(), text.size(), seed);
}

}  // namespace moeblaze
