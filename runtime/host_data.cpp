#include "host_data.hpp"

#include <algorithm>
#include <thread>

namespace moeblaze {

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), n / 4096 + 1));
  if (threads == 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back(fn, b, e);
  }
  for (auto& t : pool) t.join();
}

uint64_t mix64(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double unit_double(uint64_t seed, uint64_t index) { return (mix64(seed, index) >> 11) * (1.0 / 9007199254740992.0); }

void fill_uniform(std::vector<bf16>& v, float scale, uint64_t seed) {
  parallel_for(static_cast<int64_t>(v.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[i] = to_bf16(static_cast<float>((unit_double(seed, i) * 2.0 - 1.0) * scale));
  });
}

void fill_uniform(std::vector<float>& v, float lo, float hi, uint64_t seed) {
  parallel_for(static_cast<int64_t>(v.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[i] = static_cast<float>(lo + (hi - lo) * unit_double(seed, i));
  });
}

}  // namespace moeblaze
