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
  const double TK = double(T) * l.shape.topk, d = l.shape.hidden, n = l.shape.ffn, E = l.shape.experts;
  const double G = l.gate_parts(), W = E * n * d * 2;  // one weight matrix, bytes
  switch (f) {
    case KernelFamily::gate_up: return T * d * 2 + G * W + TK * n * 2 * (G + 1);
    case KernelFamily::down_proj: return TK * n * 2 + W + TK * d * 2;
    case KernelFamily::combine: return TK * d * 2 + T * d * 2;
    case KernelFamily::down_dgrad: return T * d * 2 + W + TK * n * 2 * G * 2 + TK * n * 2;
    case KernelFamily::down_wgrad: return T * d * 2 + TK * n * 2 + W;
    case KernelFamily::gate_up_wgrad: return TK * n * 2 * G + T * d * 2 + G * W;
    case KernelFamily::gate_up_dgrad: return TK * n * 2 * G + G * W + TK * d * 2;
    case KernelFamily::router_logits: return T * d * 2 + E * d * 2 + T * E * 4;
    default: return 0;
  }
}

double family_floor_ms(KernelFamily f, const LayerConfig& l, int64_t tokens) {
  const double flops = family_flops(f, l, tokens), bytes = family_min_bytes(f, l, tokens);
  return std::max(flops / (kGemmCeilingTflops * 1e12), bytes / (kCopyCeilingTBps * 1e12)) * 1e3;
}

}  // namespace moeblaze
