#include "host_data.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/parallel.hpp"

namespace moeblaze {

uint64_t mix64(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double unit_double(uint64_t seed, uint64_t index) { return (mix64(seed, index) >> 11) * (1.0 / 9007199254740992.0); }

void fill_uniform(std::vector<bf16>& v, float scale, uint64_t seed) {
  parallel_ranges(static_cast<int64_t>(v.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[i] = to_bf16(static_cast<float>((unit_double(seed, i) * 2.0 - 1.0) * scale));
  });
}

void fill_uniform(std::vector<float>& v, float lo, float hi, uint64_t seed) {
  parallel_ranges(static_cast<int64_t>(v.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[i] = static_cast<float>(lo + (hi - lo) * unit_double(seed, i));
  });
}

void draw_routing(const std::string& dist, int64_t T, int E, int K, uint64_t seed, std::vector<int32_t>& ids,
                  std::vector<float>& gates) {
  if (dist != "random" && dist != "skewed" && dist != "balanced" && dist != "one-hot")
    throw std::invalid_argument("routing: '" + dist + "' is not one of random, skewed, balanced, one-hot");
  ids.assign(T * K, 0);
  gates.assign(T * K, 0.f);
  const int hot = std::max(1, E / 16);
  parallel_ranges(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      uint64_t draw = 0;
      for (int j = 0; j < K; ++j) {
        int pick = 0;
        if (dist == "balanced") {
          pick = static_cast<int>((t * K + j) % E);
        } else if (dist == "one-hot") {
          pick = j;
        } else {
          for (;;) {  // rejection: K distinct experts
            const double u = unit_double(seed, static_cast<uint64_t>(t) * 1000 + draw++);
            if (dist == "skewed" && E > hot) {
              const double x = u * (4.0 * hot + (E - hot));  // hot experts weigh 4, the others 1
              pick = std::min(E - 1, x < 4.0 * hot ? static_cast<int>(x / 4.0) : hot + static_cast<int>(x - 4.0 * hot));
            } else {
              pick = static_cast<int>(u * E);
            }
            bool seen = false;
            for (int i = 0; i < j; ++i) seen |= ids[t * K + i] == pick;
            if (!seen) break;
          }
        }
        ids[t * K + j] = pick;
        gates[t * K + j] = static_cast<float>(0.1 + unit_double(seed ^ 0x5bd1e995, t * K + j));
      }
      float s = 0.f;
      for (int j = 0; j < K; ++j) s += gates[t * K + j];
      for (int j = 0; j < K; ++j) gates[t * K + j] /= s;
    }
  });
}

}  // namespace moeblaze
