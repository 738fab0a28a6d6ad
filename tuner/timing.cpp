#include "timing.hpp"

#include <algorithm>
#include <cmath>

namespace moeblaze {

Stats stats_of(std::vector<double> v) {
  Stats s;
  s.samples = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(std::round(q * (v.size() - 1)))]; };
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.spread = 0.5 * (at(0.9) - at(0.1));
  return s;
}

double family_min_bytes(KernelFamily f, const LayerConfig& l, int64_t T) {
  if (f == KernelFamily::combine) {
    const double TK = double(T) * l.shape.topk, d = l.shape.hidden;
    return TK * d * 2 + T * d * 2;  // o read, y written
  }
  if (!is_tiled(f)) return 0;
  const FamilyDef& def = family_def(f);
  return def.min_bytes ? def.min_bytes(l, T) : 0;
}

double family_floor_ms(KernelFamily f, const LayerConfig& l, int64_t tokens) {
  const double flops = family_flops(f, l, tokens), bytes = family_min_bytes(f, l, tokens);
  return std::max(flops / (kGemmCeilingTflops * 1e12), bytes / (kCopyCeilingTBps * 1e12)) * 1e3;
}

}  // namespace moeblaze
