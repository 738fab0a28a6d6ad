#include "kernel_layer.hpp"

#include <fmt/format.h>

#include "core/errors.hpp"
#include "family_def.hpp"

namespace moeblaze {

const KernelLayerDef* kernel_layer_family(KernelFamily f) { return is_tiled(f) ? family_def(f).kernel_layer : nullptr; }

int kernel_layer_accumulator_cols(const KernelSpec& spec) {
  return stacked_b_tiles(spec.family, spec.layer.activation) * spec.tile.bn;
}

int kernel_layer_staging_bytes(const KernelSpec& spec) {
  const KernelLayerDef* k = kernel_layer_family(spec.family);
  if (!k) throw InvalidArgument("family", fmt::format("the kernel layer (_cute) does not run {}", to_string(spec.family)));
  return k->staging_bytes(spec);
}

int kernel_layer_smem_bytes(const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  return t.stages * (t.bm + kernel_layer_accumulator_cols(spec)) * t.bk * 2 + kernel_layer_staging_bytes(spec) + 2048;
}

std::string kernel_layer_problem(const KernelSpec& spec, int max_smem_bytes) {
  const TileConfig& t = spec.tile;
  const LayerConfig& l = spec.layer;
  const KernelFamily f = spec.family;
  const KernelLayerDef* k = kernel_layer_family(f);
  if (!k) return fmt::format("the kernel layer (_cute) does not run {}", to_string(f));
  if (!t.persistent()) return "kernel-layer tiles are persistent: ping-pong (_pingpong) or cooperative (_persist)";
  if (!t.tma_contiguous || !t.tma_store || t.tma_store_blocks)
    return "kernel-layer tiles load contiguous operands and store the tile by TMA (_tmacontig_tmastore)";
  if (t.direct_arrive) return "kernel-layer tiles have no _directarrive (gathered copies always arrive on the full barrier)";
  if (t.cluster_m != 1 && t.cluster_m != 2) return "kernel-layer clusters are pairs along M (_cluster2x1)";
  // A pair multicasts B's stages; a gathered A is each block's own (gate_up's x rows, down_wgrad's
  // dy rows), a gathered B cannot be shared: each family says what its pair can run.
  if (t.cluster_m == 2)
    if (std::string why = k->pair_problem(spec); !why.empty()) return why;
  if (t.bk != 64) return "bk must be 64 (one 128-byte swizzle group per row)";
  if (t.pingpong()) {
    if (t.warps_m != 4 || t.warps_n != 1) return "ping-pong tiles have 4 x 1 warps (one warpgroup per tile)";
    if (t.bm != 64 && t.bm != 128) return "ping-pong tiles have bm 64 or 128 (one warpgroup's m64 slabs)";
  } else {
    if (t.bm != 128 && t.bm != 256) return "cooperative kernel-layer tiles have bm 128 or 256 (two warpgroups of m64 slabs)";
    if (t.warps_n != 1 || t.compute_threads() != 256) return "cooperative kernel-layer tiles have two consumer warpgroups";
  }
  const int cols = kernel_layer_accumulator_cols(spec);
  // gate_up's H parts and h leave in 32-column boxes where bn is an odd multiple of 32 (2 x 96).
  if (f == KernelFamily::gate_up ? t.bn % 32 || cols % 64 : t.bn % 64)
    return "kernel-layer bn must be 64, 128, 192 or 256 (64-column TMA boxes; gate_up: 2 x 32, 2 x 64, 2 x 96 or 2 x 128)";
  if (cols > 256) return fmt::format("{} accumulator columns is too many for one wgmma (at most 256)", cols);
  const int acc = t.bm * cols / (t.pingpong() ? 128 : 256);
  if (acc > 192) return fmt::format("{} accumulator registers per thread is too many (at most 192)", acc);
  // A gathered MN-major stage (the weight gradients) splits its 16-byte chunks over 128 threads.
  if (family_def(f).m_kind == RowKind::weight_rows && (t.bm == 192 || t.bn == 192))
    return "kernel-layer weight-gradient tiles are 64, 128 or 256 wide";
  if (l.shape.hidden % 8) return "TMA needs rows of a multiple of 8 elements (16 bytes)";
  if (std::string why = k->problem(spec); !why.empty()) return why;
  const int smem = kernel_layer_smem_bytes(spec);
  if (smem > max_smem_bytes) return fmt::format("{} bytes of shared memory exceeds {}", smem, max_smem_bytes);
  return {};
}

std::string kernel_layer_template_arguments(const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  const KernelLayerDef* k = kernel_layer_family(spec.family);
  if (!k) throw Error(fmt::format("the kernel layer does not run {}", to_string(spec.family)));
  return fmt::format(
      "moeblaze::sm90::KernelConfig<{}, {}, {}, moeblaze::sm90::Schedule::{}, {}, moeblaze::sm90::Major::{}, "
      "moeblaze::sm90::Major::{}>, {}",
      t.bm, kernel_layer_accumulator_cols(spec), t.stages, t.pingpong() ? "pingpong" : "cooperative", t.cluster_m,
      k->a_mn_major ? "mn" : "k", k->b_mn_major ? "mn" : "k", k->shape_arguments(spec));
}

TileConfig kernel_layer_tile(int bm, int bn, int stages, Mainloop schedule, int cluster_m) {
  TileConfig t = schedule == Mainloop::pingpong ? pingpong_tile(bm, bn, stages) : wgmma_tile(bm, bn, stages, schedule);
  t.tma_contiguous = t.tma_store = t.cute = true;
  t.cluster_m = cluster_m;
  return t;
}

}  // namespace moeblaze
