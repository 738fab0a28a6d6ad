#include "hash.hpp"

namespace moeblaze {

uint64_t fnv1a64(std::string_view bytes, uint64_t seed) {
  constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t h = seed;
  for (unsigned char c : bytes) h = (h ^ c) * kPrime;
  return h;
}

}  // namespace moeblaze
