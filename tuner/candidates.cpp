#include "candidates.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "heuristics.hpp"

namespace moeblaze {

std::vector<KernelFamily> tunable_families(const LayerConfig& layer) {
  std::vector<KernelFamily> out;
  for (const auto& s : layer_kernel_specs(layer, "sm_90a"))
    if (is_tiled(s.family)) out.push_back(s.family);
  return out;
}

std::vector<TileConfig> tile_candidates(KernelFamily family, const LayerConfig& layer, const std::string& arch,
                                        int limit) {
  const TileConfig def = default_tile(family, layer, arch);
  std::vector<TileConfig> all = {def};
  const int nb = stacked_b_tiles(family, layer.activation);
  for (int bm : {64, 128, 256})
    for (int bn : {64, 128, 256})
      for (auto [wm, wn] : {std::pair{2, 4}, {4, 2}, {2, 2}, {1, 4}, {4, 1}})
        for (int stages : {2, 3, 4, 5}) {
          TileConfig t{bm, bn, 64, wm, wn, stages};
          if (t == def) continue;
          if (!legality_problem(KernelSpec{family, layer, t, arch}).empty()) continue;
          // Deep pipelines only pay when a stage is small; keep the shared memory within
          // one block per SM and at least 2 stages of work in flight.
          const int acc = bm / wm * bn / wn * nb / 32;
          if (acc < 32) continue;
          all.push_back(t);
        }
  // Rank by closeness to the default's work per thread and by pipeline depth, so the
  // list stays useful when it is cut: vary one thing at a time first.
  auto distance = [&](const TileConfig& t) {
    int d = 0;
    d += t.bm != def.bm;
    d += t.bn != def.bn;
    d += (t.warps_m != def.warps_m || t.warps_n != def.warps_n);
    d += std::abs(t.stages - def.stages);
    return d;
  };
  std::stable_sort(all.begin() + 1, all.end(),
                   [&](const TileConfig& a, const TileConfig& b) { return distance(a) < distance(b); });
  if (static_cast<int>(all.size()) > limit) all.resize(limit);
  // wgmma tiles are not verified on a GPU yet: offered only on request.
  if (const char* e = std::getenv("MOEBLAZE_EXPERIMENTAL_WGMMA"); e && std::string(e) == "1" && supports_wgmma(family))
    for (int bm : {64, 128})
      for (int bn : {64, 128, 256})
        for (int stages : {3, 4}) {
          const TileConfig t = wgmma_tile(bm, bn, stages);
          if (legality_problem(KernelSpec{family, layer, t, arch}).empty()) all.push_back(t);
        }
  return all;
}

}  // namespace moeblaze
