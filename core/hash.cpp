#include "hash.hpp"

namespace moeblaze {

uint64_t fnv1a64(const void* data, size_t size, uint64_t seed) {
  constexpr uint64_t kPrime = 1099511628211ull;
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * kPrime;
  return h;
}

}  // namespace moeblaze
