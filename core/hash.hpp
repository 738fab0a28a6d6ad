// 64-bit FNV-1a: the one hash behind template hashes, cache keys and blob checksums. Stable
// across builds and machines (cache rows written by one build are found by another).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moeblaze {

constexpr uint64_t kFnv1aOffsetBasis = 14695981039346656037ull;

// Hash of `bytes`; `seed` continues an earlier hash (pass its result).
uint64_t fnv1a64(std::string_view bytes, uint64_t seed = kFnv1aOffsetBasis);
// A pointer and a length would bind the length to `seed`: pass a string_view instead.
uint64_t fnv1a64(const void*, size_t) = delete;

}  // namespace moeblaze
