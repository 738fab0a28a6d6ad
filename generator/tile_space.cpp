#include "tile_space.hpp"

#include <algorithm>
#include <cstdlib>

#include "kernel_layer.hpp"

namespace moeblaze {
namespace {

// The dimensions. bn is a part's width for gate_up (its accumulator holds G parts), hence the
// narrower steps there; legality_problem refuses what a family cannot take.
const int kBm[] = {64, 128, 256};
const int kBnGateUp[] = {32, 64, 96, 128};
const int kBn[] = {64, 128, 192, 256};
const int kStages[] = {2, 3, 4, 5, 6, 7, 8};
const Mainloop kSchedules[] = {Mainloop::pingpong, Mainloop::persistent};

std::vector<int> bn_steps(KernelFamily f) {
  if (f == KernelFamily::gate_up) return {std::begin(kBnGateUp), std::end(kBnGateUp)};
  return {std::begin(kBn), std::end(kBn)};
}

bool is_legal(KernelFamily f, const LayerConfig& l, const TileConfig& t, Arch arch) {
  return legality_problem(KernelSpec{f, l, t, arch}).empty();
}

std::vector<RankedTile> rank(std::vector<TileConfig> tiles, KernelFamily f, const LayerConfig& l, int64_t tokens,
                             Arch arch, const DeviceModel& device) {
  std::vector<RankedTile> out;
  for (const TileConfig& t : tiles) out.push_back({t, predicted_us(KernelSpec{f, l, t, arch}, tokens, device)});
  // Ties (the model does not tell the tile orders apart, nor a pair from a single block where
  // the loads are not the bound, nor depths past the latency's): the plainer tile first (one
  // block, the default order), then the deeper pipeline, then the name.
  std::sort(out.begin(), out.end(), [](const RankedTile& a, const RankedTile& b) {
    if (a.predicted_us != b.predicted_us) return a.predicted_us < b.predicted_us;
    if (a.tile.cluster_m != b.tile.cluster_m) return a.tile.cluster_m < b.tile.cluster_m;
    if (a.tile.alt_order != b.tile.alt_order) return !a.tile.alt_order;
    if (a.tile.stages != b.tile.stages) return a.tile.stages > b.tile.stages;
    return a.tile.to_string() < b.tile.to_string();
  });
  return out;
}

}  // namespace

std::vector<SpacePoint> kernel_layer_space(KernelFamily family, const LayerConfig& layer, Arch arch) {
  std::vector<SpacePoint> out;
  if (arch != Arch::sm_90a || !kernel_layer_family(family)) return out;
  for (Mainloop schedule : kSchedules)
    for (int bm : kBm)
      for (int bn : bn_steps(family))
        for (int stages : kStages)
          for (int cluster : {1, 2})
            for (bool alt : {false, true}) {
              TileConfig t = kernel_layer_tile(bm, bn, stages, schedule, cluster);
              t.alt_order = alt;
              out.push_back({t, legality_problem(KernelSpec{family, layer, t, arch})});
            }
  return out;
}

std::vector<RankedTile> ranked_tiles(KernelFamily family, const LayerConfig& layer, int64_t tokens, Arch arch,
                                     const DeviceModel& device) {
  std::vector<TileConfig> legal;
  for (const SpacePoint& p : kernel_layer_space(family, layer, arch))
    if (p.refused.empty()) legal.push_back(p.tile);
  return rank(std::move(legal), family, layer, tokens, arch, device);
}

std::vector<RankedTile> neighbour_tiles(const TileConfig& from, KernelFamily family, const LayerConfig& layer,
                                        int64_t tokens, Arch arch, const DeviceModel& device) {
  // A hand-written tile's neighbours are those of the kernel-layer tile of its size (and that
  // tile itself): the space is the kernel layer's.
  const TileConfig tile = from.cute ? from : kernel_layer_tile(from.bm, from.bn, from.stages, Mainloop::persistent,
                                                               from.cluster_m);
  std::vector<TileConfig> near;
  auto add = [&](const TileConfig& t) {
    if (t == from || std::find(near.begin(), near.end(), t) != near.end()) return;
    if (is_legal(family, layer, t, arch)) near.push_back(t);
  };
  if (!from.cute) add(tile);
  // The next size up and down of a list the dimension takes.
  auto steps = [](const std::vector<int>& list, int v) {
    std::vector<int> out;
    auto it = std::find(list.begin(), list.end(), v);
    if (it == list.end()) return out;
    if (it != list.begin()) out.push_back(*(it - 1));
    if (it + 1 != list.end()) out.push_back(*(it + 1));
    return out;
  };
  const Mainloop schedule = tile.pingpong() ? Mainloop::pingpong : Mainloop::persistent;
  const Mainloop other = schedule == Mainloop::pingpong ? Mainloop::persistent : Mainloop::pingpong;
  auto make = [&](int bm, int bn, int stages, Mainloop s, int cluster, bool alt) {
    TileConfig t = kernel_layer_tile(bm, bn, stages, s, cluster);
    t.alt_order = alt;
    return t;
  };
  for (int bm : steps({std::begin(kBm), std::end(kBm)}, tile.bm))
    add(make(bm, tile.bn, tile.stages, schedule, tile.cluster_m, tile.alt_order));
  for (int bn : steps(bn_steps(family), tile.bn)) add(make(tile.bm, bn, tile.stages, schedule, tile.cluster_m, tile.alt_order));
  for (int stages : {tile.stages - 1, tile.stages + 1})
    add(make(tile.bm, tile.bn, stages, schedule, tile.cluster_m, tile.alt_order));
  // The other schedule, at every depth (a schedule's staging changes what fits).
  for (int stages : kStages) add(make(tile.bm, tile.bn, stages, other, tile.cluster_m, tile.alt_order));
  add(make(tile.bm, tile.bn, tile.stages, schedule, tile.cluster_m == 2 ? 1 : 2, tile.alt_order));
  add(make(tile.bm, tile.bn, tile.stages, schedule, tile.cluster_m, !tile.alt_order));
  return rank(std::move(near), family, layer, tokens, arch, device);
}

}  // namespace moeblaze
