#include "candidates.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "core/errors.hpp"
#include "generator/heuristics.hpp"
#include "generator/kernel_layer.hpp"
#include "generator/tile_space.hpp"

namespace moeblaze {

std::vector<KernelFamily> tunable_families(const LayerConfig& layer) {
  std::vector<KernelFamily> out;
  for (const auto& s : layer_kernel_specs(layer, Arch::sm_90a))
    if (is_tiled(s.family)) out.push_back(s.family);
  return out;
}

void require_tunable(const LayerConfig& layer, const std::vector<KernelFamily>& families, const char* argument) {
  const std::vector<KernelFamily> tunable = tunable_families(layer);
  for (KernelFamily f : families)
    if (std::find(tunable.begin(), tunable.end(), f) == tunable.end()) {
      std::string names;
      for (KernelFamily t : tunable) names += (names.empty() ? "" : ", ") + to_string(t);
      throw InvalidArgument(argument, fmt::format("{} is not a tiled kernel family of this layer (tunable: {})",
                                                  to_string(f), names));
    }
}

namespace {

// The families the kernel layer's space has no legal point for (the router GEMMs; every family
// off sm_90a; gate_up and down_proj with expert biases): the default, its TMA and other-order
// variants, the tiles that won somewhere (docs/performance.md), then the product of block
// shapes, schedules and depths, closest to the default first.
std::vector<TileConfig> listed_candidates(KernelFamily family, const LayerConfig& layer, Arch arch, int limit) {
  const TileConfig def = default_tile(family, layer, arch);
  std::vector<TileConfig> all = {def};
  auto add = [&](const TileConfig& t) {  // legal and not listed yet
    if (std::find(all.begin(), all.end(), t) != all.end()) return;
    if (!legality_problem(KernelSpec{family, layer, t, arch}).empty()) return;
    all.push_back(t);
  };
  auto with_tma = [](TileConfig t) {
    t.tma_contiguous = true;
    return t;
  };
  if (has_wgmma(arch) && def.warp_specialized()) add(with_tma(def));
  if (has_wgmma(arch)) {
    TileConfig other_order = def;
    other_order.alt_order = true;
    add(other_order);
  }
  const int nb = stacked_b_tiles(family, layer.activation);
  std::vector<TileConfig> wgmma;
  if (has_wgmma(arch) && supports_wgmma(family))
    for (Mainloop m : {Mainloop::persistent, Mainloop::warp_specialized, Mainloop::wgmma_multistage})
      for (int bm : {128, 64})
        for (int bn : {128, 256, 64})
          for (int stages : {4, 3, 5, 6}) wgmma.push_back(wgmma_tile(bm, bn, stages, m));
  std::vector<TileConfig> sync;
  for (int bm : {64, 128, 256})
    for (int bn : {64, 128, 256})
      for (auto [wm, wn] : {std::pair{2, 4}, {4, 2}, {2, 2}, {1, 4}, {4, 1}})
        for (int stages : {2, 3, 4, 5}) {
          TileConfig t{bm, bn, 64, wm, wn, stages};
          // Keep at least 32 accumulators per thread: smaller warp tiles starve the tensor cores.
          if (bm / wm * bn / wn * nb / 32 < 32) continue;
          sync.push_back(t);
        }
  // Closest to the default first, so the list stays useful when it is cut.
  auto distance = [&](const TileConfig& t) {
    int d = 0;
    d += t.bm != def.bm;
    d += t.bn != def.bn;
    d += (t.warps_m != def.warps_m || t.warps_n != def.warps_n || t.mainloop != def.mainloop);
    d += std::abs(t.stages - def.stages);
    return d;
  };
  auto by_distance = [&](const TileConfig& a, const TileConfig& b) { return distance(a) < distance(b); };
  std::stable_sort(wgmma.begin(), wgmma.end(), by_distance);
  std::stable_sort(sync.begin(), sync.end(), by_distance);
  // The router GEMMs' winners on the suite: the 3-stage shared-pipeline tile (two blocks an SM)
  // and the warp-specialised 128x256 one (router_logits where E >= 256, router_wgrad).
  if (has_wgmma(arch) && supports_wgmma(family))
    for (const TileConfig& t : {wgmma_tile(128, 128, 3), wgmma_tile(128, 256, 4, Mainloop::warp_specialized),
                                wgmma_tile(128, 64, 4)})
      add(t);
  for (const auto& t : wgmma) add(t);
  for (const auto& t : sync) add(t);
  if (static_cast<int>(all.size()) > limit) all.resize(limit);
  return all;
}

}  // namespace

std::vector<TileConfig> tile_candidates(KernelFamily family, const LayerConfig& layer, Arch arch, int limit,
                                        int64_t tokens, const DeviceModel& device) {
  // The expert GEMMs on sm_90a: the default, then the kernel layer's space as the cost model
  // ranks it (generator/tile_space.hpp), for the step's T (or the stand-in the runtime uses
  // without one). Where the layer has no legal point for the family (off sm_90a, the router
  // GEMMs, expert biases or a plain activation on gate_up and down_proj), the listed tiles.
  const int64_t T = tokens > 0 ? tokens : kModelTokensWithoutT;
  const std::vector<RankedTile> ranked =
      has_cost_model(family) ? ranked_tiles(family, layer, T, arch, device) : std::vector<RankedTile>{};
  if (ranked.empty()) return listed_candidates(family, layer, arch, limit);
  const TileConfig def = default_tile(family, layer, arch, tokens);
  std::vector<TileConfig> all = {def};
  // One tile per predicted time first: the tiles the model cannot tell apart (orders, pairs,
  // depths; ranked_tiles puts the plainest first) are left to the widening rounds around the
  // winner. A limit above the distinct times takes those too, in rank order, so a limit at least
  // the space's size is every legal tile: the exhaustive search.
  std::vector<double> times;
  std::vector<const RankedTile*> tied;
  for (const RankedTile& r : ranked) {
    if (r.tile == def) continue;
    if (std::any_of(times.begin(), times.end(), [&](double t) { return std::abs(t - r.predicted_us) <= 1e-9 * t; })) {
      tied.push_back(&r);
      continue;
    }
    if (static_cast<int>(all.size()) >= limit) break;
    times.push_back(r.predicted_us);
    all.push_back(r.tile);
  }
  for (const RankedTile* r : tied) {
    if (static_cast<int>(all.size()) >= limit) break;
    all.push_back(r->tile);
  }
  return all;
}

std::vector<TileConfig> replacement_tiles(const std::vector<TileConfig>& listed, int lost,
                                          const std::vector<TileConfig>& longer) {
  std::vector<TileConfig> out;
  for (const TileConfig& t : longer) {
    if (static_cast<int>(out.size()) >= lost) break;
    if (std::find(listed.begin(), listed.end(), t) == listed.end()) out.push_back(t);
  }
  return out;
}

}  // namespace moeblaze
