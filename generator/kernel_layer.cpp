#include "kernel_layer.hpp"

#include <fmt/format.h>

#include "core/errors.hpp"

namespace moeblaze {
namespace {

const KernelLayerFamily kKernelLayer[] = {
    {KernelFamily::gate_up, "moeblaze/sm90/gate_up.cuh", "moeblaze::sm90::gate_up", false, false, true},
    {KernelFamily::down_proj, "moeblaze/sm90/down_proj.cuh", "moeblaze::sm90::down_proj", false, false, false},
    {KernelFamily::down_dgrad, "moeblaze/sm90/down_dgrad.cuh", "moeblaze::sm90::down_dgrad", false, true, true},
    {KernelFamily::down_wgrad, "moeblaze/sm90/wgrad.cuh", "moeblaze::sm90::down_wgrad", true, true, true},
    {KernelFamily::gate_up_wgrad, "moeblaze/sm90/wgrad.cuh", "moeblaze::sm90::gate_up_wgrad", true, true, true},
    {KernelFamily::gate_up_dgrad, "moeblaze/sm90/gate_up_dgrad.cuh", "moeblaze::sm90::gate_up_dgrad", false, true, false},
};

const char* b(bool v) { return v ? "true" : "false"; }
std::string act_literal(Activation a) { return "moeblaze::Activation::" + to_string(a); }

bool is_wgrad(KernelFamily f) { return f == KernelFamily::down_wgrad || f == KernelFamily::gate_up_wgrad; }

}  // namespace

const KernelLayerFamily* kernel_layer_family(KernelFamily f) {
  for (const KernelLayerFamily& k : kKernelLayer)
    if (k.family == f) return &k;
  return nullptr;
}

int kernel_layer_accumulator_cols(const KernelSpec& spec) {
  return spec.family == KernelFamily::gate_up ? stacked_b_tiles(spec.family, spec.layer.activation) * spec.tile.bn
                                              : spec.tile.bn;
}

int kernel_layer_staging_bytes(const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  const int tile_bytes = t.bm * kernel_layer_accumulator_cols(spec) * 2;
  switch (spec.family) {
    case KernelFamily::gate_up: return tile_bytes;                    // H, then h, in one tile
    case KernelFamily::down_dgrad: return 3 * tile_bytes + 1024;      // H's A and B (then dA, dB), hg; its barriers
    case KernelFamily::down_wgrad:
    case KernelFamily::gate_up_wgrad: return 2 * t.bm * 64 * 2;       // two [bm][64] bf16 blocks in turn
    default: return tile_bytes;
  }
}

int kernel_layer_smem_bytes(const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  return t.stages * (t.bm + kernel_layer_accumulator_cols(spec)) * t.bk * 2 + kernel_layer_staging_bytes(spec) + 2048;
}

std::string kernel_layer_problem(const KernelSpec& spec, int max_smem_bytes) {
  const TileConfig& t = spec.tile;
  const LayerConfig& l = spec.layer;
  const KernelFamily f = spec.family;
  const KernelLayerFamily* k = kernel_layer_family(f);
  if (!k) return fmt::format("the kernel layer (_cute) does not run {}", to_string(f));
  if (!t.persistent()) return "kernel-layer tiles are persistent: ping-pong (_pingpong) or cooperative (_persist)";
  if (!t.tma_contiguous || !t.tma_store || t.tma_store_blocks)
    return "kernel-layer tiles load contiguous operands and store the tile by TMA (_tmacontig_tmastore)";
  if (t.direct_arrive) return "kernel-layer tiles have no _directarrive (gathered copies always arrive on the full barrier)";
  if (t.cluster_m != 1 && t.cluster_m != 2) return "kernel-layer clusters are pairs along M (_cluster2x1)";
  // A pair multicasts B's stages; a gathered A is each block's own (gate_up's x rows, down_wgrad's
  // dy rows). A gathered B (gate_up_wgrad's x) cannot be shared. down_dgrad's pair (each block
  // gathering its dy rows, W2 multicast) compiles but faulted on an H100 (illegal address on
  // mixtral-8x7b, qwen3-30b-a3b and deepseek-v3 at their suite T): refused until its staging is
  // read for the pair.
  if (t.cluster_m == 2 && k->gathered && f != KernelFamily::down_wgrad && f != KernelFamily::gate_up)
    return "kernel-layer cluster pairs are for the families whose B comes by TMA alone (gate_up, down_proj, gate_up_dgrad, down_wgrad)";
  if (t.cluster_m == 2 && f == KernelFamily::gate_up && !is_gated(l.activation))
    return "a gate_up pair splits W1 | W3 between its blocks: gated activations only";
  if (t.cluster_m == 2 && f == KernelFamily::down_wgrad && t.bn % 128)
    return "a down_wgrad pair splits hg's 64-column boxes between its blocks: bn 128 or 256";
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
  if (is_wgrad(f) && (t.bm == 192 || t.bn == 192)) return "kernel-layer weight-gradient tiles are 64, 128 or 256 wide";
  if (l.shape.hidden % 8) return "TMA needs rows of a multiple of 8 elements (16 bytes)";
  switch (f) {
    case KernelFamily::down_proj:
      if (l.expert_bias) return "the kernel layer's down_proj does not add expert biases yet";
      break;
    case KernelFamily::gate_up:
      if (l.expert_bias) return "the kernel layer's gate_up does not add expert biases yet";
      if (!is_gated(l.activation)) return "the kernel layer's gate_up runs gated activations (plain ones spill its epilogue)";
      break;
    case KernelFamily::gate_up_dgrad:
      if (l.shape.ffn % 64) return "kernel-layer gate_up_dgrad tiles need n % 64 == 0 (W1/W3 k stages inside one matrix)";
      break;
    case KernelFamily::down_dgrad:
      if (l.shape.hidden % 64) return "kernel-layer down_dgrad tiles need d % 64 == 0 (W2_e's k stages inside its rows)";
      // Wide-h layers run down dgrad + down wgrad in hg column chunks of a multiple of 256.
      if (t.bn == 192) return "192-wide tiles are not for down_dgrad (its column chunks are multiples of 256)";
      break;
    // The ragged TMA source of the weight gradients (sm90/operand_tma.cuh TmaRaggedColsMN) loads
    // a stage's MN extent as 64-column boxes; a tile reaching past the extent (hg's n columns
    // for down_wgrad, dH's G n for gate_up_wgrad) made those loads fault on an H100
    // (compute-sanitizer: illegal address in the TMA load, n = 128 under a 256-wide down_wgrad
    // tile). The same fault in down_dgrad's H loads came from boxes that start past the map's
    // last column (sm90/staging.cuh, live_boxes); the mainloop's stages expect a fixed byte
    // count, so such tiles are refused here rather than loaded box by box.
    case KernelFamily::down_wgrad:
      if (l.shape.ffn % t.bn)
        return fmt::format("kernel-layer down_wgrad tiles need n % bn == 0 (n = {}, bn = {}): a column tile past n faults in the ragged hg loads",
                           l.shape.ffn, t.bn);
      break;
    case KernelFamily::gate_up_wgrad:
      if (l.gate_parts() * l.shape.ffn % t.bm)
        return fmt::format("kernel-layer gate_up_wgrad tiles need G n % bm == 0 (G n = {}, bm = {}): a row tile past G n faults in the ragged dH loads",
                           l.gate_parts() * l.shape.ffn, t.bm);
      // A row tile straddling dW1 | dW3 stores 64-row pieces, each inside one matrix
      // (sm90/epilogue_wgrad.cuh); a piece that itself straddled would need a store from a
      // negative row, which faults (illegal instruction in SM90_TMA_STORE_3D, H100).
      if (l.gate_parts() == 2 && l.shape.ffn % t.bm && l.shape.ffn % 64)
        return fmt::format("kernel-layer gate_up_wgrad tiles need n % 64 == 0 where n % bm != 0 (n = {}, bm = {}): a row tile straddling dW1 | dW3 is stored in 64-row pieces",
                           l.shape.ffn, t.bm);
      break;
    default: break;
  }
  const int smem = kernel_layer_smem_bytes(spec);
  if (smem > max_smem_bytes) return fmt::format("{} bytes of shared memory exceeds {}", smem, max_smem_bytes);
  return {};
}

std::string kernel_layer_template_arguments(const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  const MoeShape& m = spec.layer.shape;
  const KernelLayerFamily& k = *kernel_layer_family(spec.family);
  const std::string cfg = fmt::format(
      "moeblaze::sm90::KernelConfig<{}, {}, {}, moeblaze::sm90::Schedule::{}, {}, moeblaze::sm90::Major::{}, "
      "moeblaze::sm90::Major::{}>",
      t.bm, kernel_layer_accumulator_cols(spec), t.stages, t.pingpong() ? "pingpong" : "cooperative", t.cluster_m,
      k.a_mn_major ? "mn" : "k", k.b_mn_major ? "mn" : "k");
  const std::string act = act_literal(spec.layer.activation);
  const int w_rows = spec.layer.w1_rows();
  switch (spec.family) {
    case KernelFamily::gate_up:
    case KernelFamily::gate_up_dgrad:
      return fmt::format("{}, {}, {}, {}, {}, {}, {}", cfg, m.experts, m.hidden, m.ffn, act, w_rows, b(t.alt_order));
    case KernelFamily::down_proj:
    case KernelFamily::down_wgrad: return fmt::format("{}, {}, {}, {}, {}", cfg, m.experts, m.hidden, m.ffn, b(t.alt_order));
    case KernelFamily::down_dgrad:
      return fmt::format("{}, {}, {}, {}, {}, {}, {}", cfg, m.experts, m.topk, m.hidden, m.ffn, act, b(t.alt_order));
    case KernelFamily::gate_up_wgrad:
      return fmt::format("{}, {}, {}, {}, {}, {}", cfg, m.experts, m.hidden, m.ffn, act, b(t.alt_order));
    default: break;
  }
  throw Error(fmt::format("the kernel layer does not run {}", to_string(spec.family)));
}

TileConfig kernel_layer_tile(int bm, int bn, int stages, Mainloop schedule, int cluster_m) {
  TileConfig t = schedule == Mainloop::pingpong ? pingpong_tile(bm, bn, stages) : wgmma_tile(bm, bn, stages, schedule);
  t.tma_contiguous = t.tma_store = t.cute = true;
  t.cluster_m = cluster_m;
  return t;
}

}  // namespace moeblaze
