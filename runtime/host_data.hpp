// Host-side test data: deterministic parallel random fills (counter-based, so the same
// seed gives the same data whatever the thread count) and routing draws.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "bf16.hpp"

namespace moeblaze {

// Runs fn(begin, end) over [0, n) split across hardware threads.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

// Uniform in [-scale, scale), never exactly zero in distribution (bf16 rounding aside).
void fill_uniform(std::vector<bf16>& v, float scale, uint64_t seed);
void fill_uniform(std::vector<float>& v, float lo, float hi, uint64_t seed);

// A 64-bit mix of (seed, index): the counter-based generator behind the fills.
uint64_t mix64(uint64_t seed, uint64_t index);
double unit_double(uint64_t seed, uint64_t index);  // in [0, 1)

}  // namespace moeblaze
