// Host-side test data: deterministic parallel random fills (counter-based, so the same
// seed gives the same data whatever the thread count) and routing draws.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/bf16.hpp"

namespace moeblaze {

// Caller-side routing for tests and timing: K distinct experts per token, positive gates
// summing to 1. dist: "random" (uniform), "skewed" (E/16 hot experts, at least 1, carry
// 4x the mean load), "balanced" (token t picks (t*K + j) mod E), "one-hot" (experts 0..K-1).
void draw_routing(const std::string& dist, int64_t T, int E, int K, uint64_t seed, std::vector<int32_t>& ids,
                  std::vector<float>& gates);

// Uniform in [-scale, scale), never exactly zero in distribution (bf16 rounding aside).
void fill_uniform(std::vector<bf16>& v, float scale, uint64_t seed);
void fill_uniform(std::vector<float>& v, float lo, float hi, uint64_t seed);

// A 64-bit mix of (seed, index): the counter-based generator behind the fills.
uint64_t mix64(uint64_t seed, uint64_t index);
double unit_double(uint64_t seed, uint64_t index);  // in [0, 1)

}  // namespace moeblaze
