#include "candidates.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <tuple>

#include "generator/heuristics.hpp"
#include "generator/kernel_layer.hpp"

namespace moeblaze {

std::vector<KernelFamily> tunable_families(const LayerConfig& layer) {
  std::vector<KernelFamily> out;
  for (const auto& s : layer_kernel_specs(layer, Arch::sm_90a))
    if (is_tiled(s.family)) out.push_back(s.family);
  return out;
}

std::vector<TileConfig> tile_candidates(KernelFamily family, const LayerConfig& layer, Arch arch,
                                        int limit) {
  const TileConfig def = default_tile(family, layer, arch);
  std::vector<TileConfig> all = {def};
  auto add = [&](const TileConfig& t) {  // legal and not listed yet
    if (std::find(all.begin(), all.end(), t) != all.end()) return;
    if (!legality_problem(KernelSpec{family, layer, t, arch}).empty()) return;
    all.push_back(t);
  };
  // The TMA variant of a warp-specialised tile (the operands that are not gathered by
  // cp.async.bulk.tensor; `add` keeps it where legal: every expert GEMM, the dgrads' MN-major
  // weight stages only when d or n is a multiple of 64).
  auto with_tma = [](TileConfig t) {
    t.tma_contiguous = true;
    return t;
  };
  if (has_wgmma(arch) && def.warp_specialized()) add(with_tma(def));
  // The kernel layer's tiles (templates/moeblaze/sm90/), the GEMMs' direction: first after the
  // default, so every tune times them against it (whose check they must pass first).
  if (arch == Arch::sm_90a)
    for (const TileConfig& t : kernel_layer_candidates(family)) add(t);
  // The weight gradients: first the two staged tiles with the producer's direct arrivals,
  // whichever the default is not (the default picks by the slots an expert has,
  // generator/heuristics.cpp): _tmastore64 (faster in bf16 where slots are few, but fp32 main
  // gradients from registers) and _tmastore (3 stages, the few-slot default). Then the earlier
  // defaults: _tmastore on the persistent 128x256 tile and the 4-stage register-store tile (the
  // 128x128 _tmastore tile comes after the established kinds).
  if (has_wgmma(arch) && (family == KernelFamily::gate_up_wgrad || family == KernelFamily::down_wgrad)) {
    TileConfig blocks = with_tma(wgmma_tile(128, 256, 4, Mainloop::persistent));
    blocks.tma_store = blocks.tma_store_blocks = blocks.direct_arrive = true;
    TileConfig staged = with_tma(wgmma_tile(128, 256, 3, Mainloop::persistent));
    staged.tma_store = staged.direct_arrive = true;
    add(staged);
    add(blocks);
    TileConfig plain_staged = with_tma(wgmma_tile(128, 256, 3, Mainloop::persistent));
    plain_staged.tma_store = true;
    add(plain_staged);
    add(with_tma(wgmma_tile(128, 256, 4, Mainloop::persistent)));
  }
  // The per-slot outputs' (down_proj, gate_up_dgrad) earlier defaults: the cooperative 128x256
  // _tmastore64 tile (down_proj's where its default is the ping-pong tile), the whole-tile
  // TMA-store persistent tile (short reductions) and the 4-stage register-store one (long), 192
  // wide where that fills the last column of tiles.
  if (has_wgmma(arch) && (family == KernelFamily::down_proj || family == KernelFamily::gate_up_dgrad)) {
    TileConfig blocks = with_tma(wgmma_tile(128, 256, 4, Mainloop::persistent));
    blocks.tma_store = blocks.tma_store_blocks = true;
    add(blocks);
    for (int bn : {256, fits_192_better(family, layer) ? 192 : 256}) {
      TileConfig staged = wgmma_tile(def.bm, bn, 3, Mainloop::persistent);
      staged.tma_contiguous = staged.tma_store = true;
      add(staged);
      add(with_tma(wgmma_tile(def.bm, bn, 4, family == KernelFamily::down_proj ? Mainloop::persistent
                                                                             : Mainloop::warp_specialized)));
    }
  }
  // gate_up's hand-written tiles: the cooperative 128-wide tile, QuACK's 128 x (2 x 96) ping-pong
  // tile with direct arrivals, 2 x 160 where n is a multiple of 160, and the cluster pair where
  // the weights stream.
  if (has_wgmma(arch) && family == KernelFamily::gate_up) {
    add(with_tma(wgmma_tile(128, 128, 4, Mainloop::persistent)));
    TileConfig pingpong = with_tma(wgmma_tile(128, 96, 5, Mainloop::pingpong));
    pingpong.direct_arrive = true;
    add(pingpong);
    if (layer.shape.ffn % 160 == 0) add(with_tma(wgmma_tile(128, 160, 4, Mainloop::persistent)));
    // Where the weights stream, the cooperative tile as a cluster pair multicasting the weight
    // stages (deepseek-v3's default before the kernel layer's 2 x 96 tile).
    if (weights_stream(layer, 0)) {
      TileConfig pair = with_tma(wgmma_tile(128, 128, 4, Mainloop::persistent));
      pair.cluster_m = 2;
      add(pair);
    }
  }
  // The other tile order of the default (`add` keeps it for the expert GEMMs' wgmma tiles).
  if (has_wgmma(arch)) {
    TileConfig other_order = def;
    other_order.alt_order = true;
    add(other_order);
  }
  // The default 256 columns wide made 192 where the output's columns are a multiple of 192
  // but not of 256 (gpt-oss-20b: d = n = 2880 = 15 x 192 = 11.25 x 256): the last column of
  // tiles is whole instead of a quarter full (6% of the tiles' work).
  if (has_wgmma(arch) && def.wgmma() && def.bn == 256 && fits_192_better(family, layer)) {
    TileConfig narrow = def;
    narrow.bn = 192;
    add(narrow);
  }
  const int nb = stacked_b_tiles(family, layer.activation);
  // Hopper: wgmma tiles first (persistent and one-tile warp-specialised, then the shared
  // pipeline), mma.sync last.
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
  // Rank by closeness to the default, so the list stays useful when it is cut: vary one
  // thing at a time first.
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
  // Tiles that won somewhere on the suite (docs/performance.md) come right after the default: the
  // 3-stage shared-pipeline tiles fit two blocks per SM, the warp-specialised ones one; then
  // the persistent 128x256 (and 128x128) tiles, the ones shared-memory bandwidth favours.
  // (`add` drops what is illegal for the family, e.g. persistent router GEMMs.)
  if (has_wgmma(arch) && supports_wgmma(family))
    for (const TileConfig& t :
         {wgmma_tile(128, 128, 3), wgmma_tile(128, 128, 4, Mainloop::warp_specialized),
          wgmma_tile(128, 256, 4, Mainloop::warp_specialized), wgmma_tile(128, 256, 4, Mainloop::persistent),
          wgmma_tile(128, 128, 4, Mainloop::persistent), wgmma_tile(128, 256, 3)}) {
      add(t);
      if (t.warp_specialized()) add(with_tma(t));
    }
  // After the kinds that won somewhere on the suite: the newer kinds, measured slower or not yet
  // measured on the suite shapes (docs/performance.md), so a short tune still spans the established
  // ones first.
  // The default with the producer's other barrier protocol (_directarrive on or off): it won on
  // the gathered backward GEMMs and lost on gate_up (generator/heuristics.cpp), by
  // a few percent either way.
  if (has_wgmma(arch) && def.warp_specialized()) {
    TileConfig other = def;
    other.direct_arrive = !def.direct_arrive;
    add(other);
  }
  // Cluster pairs sharing the weight operand by TMA multicast: the default made a pair (its
  // persistent form where it is one-tile), and the 64-row ping-pong tile as a pair (the pair
  // loads the weight stage once for 128 rows, as the cooperative 128-row tile does).
  if (has_wgmma(arch)) {
    TileConfig pair = with_tma(def);
    if (pair.mainloop == Mainloop::warp_specialized) pair.mainloop = Mainloop::persistent;
    pair.cluster_m = 2;
    add(pair);
    TileConfig pp = with_tma(pingpong_tile(64, 256 / stacked_b_tiles(family, layer.activation), 5));
    pp.cluster_m = 2;
    add(pp);
  }
  // Ping-pong tiles (two consumer warpgroups on alternate tiles, one's epilogue under the other's
  // mainloop): 128 rows a warpgroup (two m64 slabs; the gated up-projection's W1 and W3 tiles 64
  // wide each) or 64 rows with the full 256 columns, TMA for the operands that are not gathered,
  // and the TMA-store epilogue for the weight gradients. `add` keeps them for the expert GEMMs.
  if (has_wgmma(arch)) {
    const int nb_pp = stacked_b_tiles(family, layer.activation);
    const bool wgrad = family == KernelFamily::gate_up_wgrad || family == KernelFamily::down_wgrad;
    for (auto [bm, bn, stages] : {std::tuple{128, 128 / nb_pp, 6}, std::tuple{64, 256 / nb_pp, 5}, std::tuple{128, 128 / nb_pp, 4}}) {
      TileConfig t = with_tma(pingpong_tile(bm, bn, stages));
      add(t);
      if (wgrad && stages == 4) {
        t.tma_store = true;
        add(t);
      }
    }
  }
  // The weight gradients' 128x128 persistent _tmastore tile (4 stages beside its 32 KiB staging).
  if (has_wgmma(arch) && (family == KernelFamily::gate_up_wgrad || family == KernelFamily::down_wgrad)) {
    TileConfig t = with_tma(wgmma_tile(128, 128, 4, Mainloop::persistent));
    t.tma_store = true;
    add(t);
  }
  for (const auto& t : wgmma) add(t);
  for (const auto& t : sync) add(t);
  if (static_cast<int>(all.size()) > limit) all.resize(limit);
  return all;
}

}  // namespace moeblaze
