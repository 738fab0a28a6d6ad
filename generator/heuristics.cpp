#include "heuristics.hpp"

#include <optional>

#include "family_def.hpp"
#include "kernel_layer.hpp"

namespace moeblaze {

int output_columns(KernelFamily f, const LayerConfig& l) {
  if (!is_tiled(f)) return 0;
  const GemmProblem p = family_problem(f, l);
  const bool expert_gemm = p.m_kind == RowKind::expert_slots || p.m_kind == RowKind::weight_rows;
  return expert_gemm ? static_cast<int>(p.tile_cols()) : 0;
}

bool fits_192_better(KernelFamily family, const LayerConfig& layer) {
  const int cols = output_columns(family, layer);
  return cols > 0 && cols % 256 != 0 && cols % 192 == 0;
}

// down_dgrad's reduction length (d) from which the persistent 128x256 tile is the default
// (measured down to d = 2048; shorter reductions are unmeasured and keep the `_wgmma` tile).
constexpr int kLongDgradReduction = 2048;

// down_proj's and gate_up_dgrad's reduction length (n, G n) up to which the TMA-store
// persistent tile is their default: 48 k-steps, between the longest measured win (45) and the
// shortest measured loss (64).
constexpr int kShortSlotReduction = 48 * 64;

// down_proj's reduction length (n) up to which its default is the 128x192 ping-pong tile: 16
// k-steps of 64, the longest measured win (deepseek-v3's 32 measured level).
constexpr int kPingpongSlotReduction = 16 * 64;

// gate_up_dgrad's reduction length (G n) up to which the kernel layer's cooperative 128x256
// tile is its default: 64 k-steps of 64 (deepseek-v3's 4096, the longest measured win);
// mixtral-8x7b's 28672 measured level with the hand-written 128x256 tile, which stays there.
constexpr int kKernelLayerReduction = 64 * 64;

// The layers the n-dependent tiles below were measured on: h no wider than d, so the forward
// runs in one slot chunk (runtime/memory_plan.cpp forward_chunks); a wider h keeps the earlier
// tile until a GPU has run the pairing.
static bool h_within_d(const LayerConfig& layer) { return layer.shape.ffn <= layer.shape.hidden; }

bool few_slots_per_expert(const LayerConfig& layer, int64_t tokens) {
  const int64_t E = layer.shape.experts, K = layer.shape.topk;
  return tokens > 0 ? tokens * K <= 2048 * E : E >= 8 * K;
}

bool wide_experts(const LayerConfig& layer) {
  const int64_t weight_bytes = int64_t{layer.gate_parts()} * layer.shape.ffn * layer.shape.hidden * 2;
  return weight_bytes > (int64_t{40} << 20);
}

bool weights_stream(const LayerConfig& layer, int64_t tokens) {
  const int64_t E = layer.shape.experts, K = layer.shape.topk;
  const bool few_slots = tokens > 0 ? tokens * K <= 1024 * E : E >= 16 * K;
  return wide_experts(layer) && few_slots;
}

TileConfig default_tile(KernelFamily family, const LayerConfig& layer, Arch arch, int64_t tokens) {
  if (const auto leader = tile_follows(family)) return default_tile(*leader, layer, arch, tokens);
  if (has_wgmma(arch) && is_tiled(family)) {
    // wgmma: the winners of `moeblaze tune` on the suite shapes (docs/performance.md
    // "Decisions"), TMA for every operand that is not gathered. Warp-specialised 128x256
    // wherever the producer's loads are TMA boxes or a pointer and a stride per stage; the
    // shared pipeline at 3 stages where two blocks per SM let one block's epilogue overlap
    // the other's mainloop (down_dgrad on short reductions, below). Measured on mixtral-8x7b
    // (ms): gate_up 14.9 -> 13.1 and down_proj 6.5 -> 5.5 (`_persist_tmacontig` against
    // `_ws`); gate_up_wgrad 18.7 (`_wgmma` 128x128) -> 16.2 `_persist_tmacontig` (deepseek-v3 28.5,
    // level with `_wgmma`), down_wgrad 9.0 -> 7.4 `_persist_tmacontig` (deepseek-v3 15.2 ->
    // 12.5), gate_up_dgrad 12.4 -> 10.7 `_ws_tmacontig`.
    // TMA where the layer allows it (e.g. gate_up_dgrad's MN-major weight boxes need n % 64 == 0);
    // elsewhere the same tile with cp.async loads.
    auto tma = [&](TileConfig t) {
      TileConfig with = t;
      with.tma_contiguous = true;
      return legality_problem(KernelSpec{family, layer, with, arch}).empty() ? with : t;
    };
    // 192 columns instead of 256 where that fills the last column of tiles, for the two
    // all-TMA GEMMs (gpt-oss-20b: down_proj 1.880 -> 1.798 ms, gate_up_dgrad 3.494 -> 3.265);
    // gate_up_wgrad's gathered 192-wide B ran slower (5.100 -> 5.270) and keeps 256.
    // Only with TMA loads (a layer that cannot take them, e.g. gate_up_dgrad with n % 64 != 0,
    // keeps the 256-wide cp.async tile).
    auto wide_tile = [&](Mainloop mainloop) {
      if (fits_192_better(family, layer)) {
        TileConfig narrow = tma(wgmma_tile(128, 192, 4, mainloop));
        if (narrow.tma_contiguous) return narrow;
      }
      return tma(wgmma_tile(128, 256, 4, mainloop));
    };
    // The TMA-store epilogue in 64-column blocks (_tmastore64): the consumers stage 64 columns
    // at a time in two 16 KiB buffers and go on while the stores drain, and the fourth 48 KiB
    // stage stays (a whole-tile staging buffer costs it). Default of the per-slot outputs
    // (down_proj's o, gate_up_dgrad's dxs) on every reduction length, and of the weight
    // gradients where an expert's slots are many (below). Against the previous defaults (ms, the
    // same call, two alternating rounds; docs/performance.md "Decisions"): down_proj
    // qwen3-30b-a3b 1.560 -> 1.590 (within the run's noise), mixtral-8x7b 5.862 -> 5.832,
    // gpt-oss-20b (from 128x192) 1.870 -> 1.826, deepseek-v3 8.121 -> 7.681; gate_up_dgrad
    // qwen3-30b-a3b 2.797 -> 2.689, olmoe-1b-7b 3.601 -> 3.412, mixtral-8x7b 11.324 -> 11.399,
    // gpt-oss-20b (from 128x192) 3.399 -> 3.438, deepseek-v3 13.829 -> 13.669.
    // Where the layer cannot take it (expert biases on down_proj, no TMA loads) the earlier
    // rules below pick the tile.
    auto blocks_store_tile = [&](int bn = 256, Mainloop mainloop = Mainloop::persistent) {
      TileConfig t = wgmma_tile(128, bn, 4, mainloop);
      t.tma_contiguous = t.tma_store = t.tma_store_blocks = true;
      return t;
    };
    auto legal = [&](const TileConfig& t) { return legality_problem(KernelSpec{family, layer, t, arch}).empty(); };
    // The per-slot outputs without _tmastore64, on short reductions: the whole-tile TMA-store
    // epilogue on a persistent tile, whose 3 stages leave room for the staging buffer
    // (gemm/epilogue/row_store.cuh). Against the 4-stage tiles (ms; k-steps of 64 a tile):
    // down_proj qwen3-30b-a3b (12) 2.006 -> 1.553, deepseek-v3 (32) 8.269 -> 8.102, gpt-oss-20b
    // (45, 128x192) 1.880 -> 1.849, mixtral-8x7b (224) 5.818 -> 6.216; gate_up_dgrad (from
    // `_ws`) qwen3-30b-a3b (24) 3.082 -> 2.772, deepseek-v3 (64) 13.743 -> 14.633, gpt-oss-20b
    // (90) 3.396 -> 3.746, mixtral-8x7b (448) 11.383 -> 12.174. On long reductions the fourth
    // stage is worth more than the overlap. Where the layer cannot take it either, the 4-stage
    // tile stays.
    auto slot_rows_tile = [&](Mainloop mainloop) {
      if (const TileConfig blocks = blocks_store_tile(); legal(blocks)) return blocks;
      const TileConfig wide = wide_tile(mainloop);
      if (family_problem(family, layer).reduction > kShortSlotReduction) return wide;
      TileConfig staged = wgmma_tile(wide.bm, wide.bn, 3, Mainloop::persistent);
      staged.tma_contiguous = wide.tma_contiguous;
      staged.tma_store = true;
      return legal(staged) ? staged : wide;
    };
    // The gathered backward GEMMs' producer with its copies arriving on the consumers' full
    // barrier (`cp.async.mbarrier.arrive.noinc`, _directarrive) instead of its polling a
    // `landed` barrier and arriving itself: one hop less before the consumers start and no
    // polling on the producer's issue path. Measured on the default tiles of all six suite
    // shapes (ms, the same call): gate_up_wgrad 1.13x-1.16x and down_wgrad 1.04x-1.14x faster,
    // down_dgrad 1.00x-1.06x; gate_up (its gathered rows fetched once a tile) 0.96x-0.99x and
    // 0.83x on deepseek-v3, so gate_up keeps the polling producer.
    // The kernel layer (templates/moeblaze/sm90, `_cute`): its consumer k-step is 59-64
    // instructions around eight wgmmas against 111 in the hand-written kernels. Its cooperative
    // 128x256 tile (3 stages, TMA loads, the ragged TMA store) against the previous defaults,
    // bench/ab.py, the same call, two alternating rounds (ms; H100 SXM; docs/performance.md,
    // "The kernel layer's defaults"):
    // - down_proj: deepseek-v3 8.045 -> 6.060, qwen3-30b-a3b 1.531 -> 1.363, mixtral-8x7b 5.322
    //   -> 5.052. Its 128x128 ping-pong tile (the previous default) 8.184 / 1.553 / 7.793, the
    //   ping-pong pair 8.176 / 1.447 / 8.455.
    // - gate_up_dgrad: deepseek-v3 17.309 (the 128x128 ping-pong) -> 11.469, qwen3-30b-a3b
    //   3.216 -> 2.567; mixtral-8x7b 10.424 (hand-written) -> 10.530, level, keeps its tile
    //   (kKernelLayerReduction).
    // - down_wgrad: deepseek-v3 8.557 -> 8.070, qwen3-30b-a3b 1.507 -> 1.418, mixtral-8x7b 6.357
    //   -> 6.174. gate_up_wgrad lost on all three (15.986 -> 16.637, 2.932 -> 3.724, 12.711 ->
    //   17.799) and keeps its tiles.
    // Where d is a multiple of 256 (whole column tiles).
    // Where 192 fills d and 256 does not (gpt-oss-20b's 2880 = 15 x 192), the layer's 192-wide
    // tiles against the hand-written ones (bench/ab.py, the same call, two rounds; H100 SXM;
    // grad-checked at T = 4096): gate_up_dgrad's cooperative 128x192 3.453 -> 3.088 ms (its long
    // reduction, G n = 5760, included), down_proj's ping-pong 128x192 1.638 -> 1.570 (cooperative
    // 1.596); step 17.76 -> 17.41. The weight gradients have no 192-wide layer tiles.
    auto kernel_layer_tile = [&]() -> std::optional<TileConfig> {
      TileConfig t;
      if (layer.shape.hidden % 256 == 0) {
        if (family == KernelFamily::gate_up_dgrad && layer.gate_parts() * layer.shape.ffn > kKernelLayerReduction)
          return std::nullopt;
        t = moeblaze::kernel_layer_tile(128, 256, 3, Mainloop::persistent);
      } else if (layer.shape.hidden % 192 == 0 && family != KernelFamily::down_wgrad) {
        t = moeblaze::kernel_layer_tile(128, 192, 4, family == KernelFamily::down_proj ? Mainloop::pingpong : Mainloop::persistent);
      } else {
        return std::nullopt;
      }
      if (!legal(t)) return std::nullopt;
      return t;
    };
    auto direct = [&](TileConfig t) {
      TileConfig with = t;
      with.direct_arrive = true;
      return legal(with) ? with : t;
    };
    switch (family) {
      case KernelFamily::gate_up: {
        // The kernel layer's ping-pong 128 x (2 x 96) tile (QuACK's gate_up tile: the gathered x
        // rows by the producer warpgroup, W1 | W3 by TMA, H and h leaving by TMA in 32-column
        // boxes through one staging tile, 4 stages) against the hand-written defaults below,
        // bench/ab.py, the same call, two alternating rounds (ms; H100 SXM; grad-checked):
        // qwen3-30b-a3b 3.170 -> 2.590, gpt-oss-20b 4.219 -> 3.459, olmoe-1b-7b 4.582 -> 3.622,
        // mixtral-8x7b 13.744 -> 12.964 (n % 96 != 0 on the last two: their last column of tiles
        // is clipped by the TMA stores; mixtral-8x7b's n > d runs the forward in slot chunks).
        // Its 2 x 64 and 2 x 128 tiles had lost (docs/performance.md). Where the weights stream
        // (deepseek-v3), against the hand-written cluster pair below: 14.716 -> 12.207 ms, step
        // 66.96 -> 65.78, and 11.965 -> 11.669 beside the build before it (bench/ab.py, H100;
        // docs/performance.md, "Pairs and four-stage weight gradients").
        // Where an expert's weights are wide (over 40 MiB) and its slots many (not
        // weights_stream: mixtral-8x7b at T = 16384, 4096 slots an expert), the tile as a cluster
        // pair, each block loading W1's or W3's rows and multicasting them (QuACK pairs its gate_up
        // there too): mixtral-8x7b 12.983 -> 11.380 ms, step 58.29 -> 56.59 (bench/ab.py, H100,
        // two rounds); on deepseek-v3, whose weights stream, the pair lost (11.669 -> 12.792).
        {
          const TileConfig t = moeblaze::kernel_layer_tile(128, 96, 4, Mainloop::pingpong);
          if (wide_experts(layer) && !weights_stream(layer, tokens)) {
            const TileConfig pair = moeblaze::kernel_layer_tile(128, 96, 4, Mainloop::pingpong, 2);
            if (legal(pair)) return pair;
          }
          if (legal(t)) return t;
        }
        // QuACK's gate_up (SonicMoE's kernel on qwen3-30b-a3b and gpt-oss-20b): a ping-pong
        // warpgroup owns a 128 x (2 x 96) tile, its epilogue under the other's mainloop, and the
        // gathered x rows arrive on the full barrier directly (_directarrive). Nsight Compute on
        // qwen3-30b-a3b (locked clocks): 3.67 ms for the cooperative 128 x (2 x 128) tile, 3.27
        // for this one, against SonicMoE's 2.71. Where n is a multiple of 96 (no partial last
        // column of tiles) and n <= d (h_within_d).
        if (layer.shape.ffn % 96 == 0 && h_within_d(layer)) {
          TileConfig pp = tma(wgmma_tile(128, 96, 5, Mainloop::pingpong));
          pp.direct_arrive = true;
          if (pp.tma_contiguous && legal(pp)) return pp;
        }
        // Gated: 2 x bn columns. 160 wide where n is a multiple of 160 but not of 128, so the
        // last column of tiles is whole (gpt-oss-20b's 2880 = 18 x 160 = 22.5 x 128): gate_up
        // 4.213 -> 4.108 and 4.121 -> 4.060 ms in two calls (K-major TMA weight boxes of 160
        // rows; register stores, as the 128-wide tile). Where n <= d (h_within_d).
        if (layer.shape.ffn % 128 != 0 && layer.shape.ffn % 160 == 0 && h_within_d(layer)) {
          const TileConfig fill = tma(wgmma_tile(128, 160, 4, Mainloop::persistent));
          if (fill.tma_contiguous && legal(fill)) return fill;
        }
        // Where the weights stream (weights_stream: deepseek-v3), a cluster pair of M-adjacent
        // blocks that multicast the weight tile: half the weight reads and the two blocks in step.
        // Its gate_up, the same call (bench/ab.py, grad-checked): 17.383 -> 14.895 ms, where the
        // cooperative tile under Nsight Compute ran at 40% L2 hits and 3.5 TB/s of DRAM.
        const TileConfig cooperative = tma(wgmma_tile(128, 128, 4, Mainloop::persistent));
        if (weights_stream(layer, tokens)) {
          TileConfig pair = cooperative;
          pair.cluster_m = 2;
          if (pair.tma_contiguous && legal(pair)) return pair;
        }
        return cooperative;
      }
      case KernelFamily::down_proj: {
        // Ping-pong 128x192 with the 64-column TMA-store epilogue: one consumer warpgroup's
        // epilogue runs under the other's mainloop, which pays where the reduction is short
        // (the epilogue a large share of a tile) or where 192 fills d and 256 does not.
        // down_proj ms against the 128x256 `_tmastore64` tile (the same call, two alternating
        // rounds, grad-checked): qwen3-next-80b (n 512) 1.649 -> 1.536, qwen3-30b-a3b (768)
        // 1.566 -> 1.477, olmoe-1b-7b (1024) 1.889 -> 1.801, gpt-oss-20b (2880 = 15 x 192) 1.761
        // -> 1.618; deepseek-v3 (2048) 7.614 -> 7.606 and mixtral-8x7b (14336) 5.715 -> 5.940
        // keep the cooperative tile. (Each warpgroup's tile is whole, so its A rows are read per
        // 192 columns instead of 256: that costs where the reduction is long.) Where n <= d
        // (h_within_d).
        if (const auto cute = kernel_layer_tile()) return *cute;
        const TileConfig pingpong = blocks_store_tile(192, Mainloop::pingpong);
        const bool short_reduction = layer.shape.ffn <= kPingpongSlotReduction;
        if (h_within_d(layer) && (short_reduction || fits_192_better(family, layer)) && legal(pingpong)) return pingpong;
        return slot_rows_tile(Mainloop::persistent);
      }
      case KernelFamily::gate_up_wgrad:
      case KernelFamily::down_wgrad: {
        // Both take _directarrive (above). The epilogue, by the slots an expert has (T K / E, the
        // tiles' reduction length; the runtime's load hint gives T, the bindings load one kernel
        // set per token bucket, and without it E / K stands in):
        // - Few (at most 2048): the whole-tile TMA-store epilogue (_tmastore, 3 stages), against
        //   4-stage register stores: deepseek-v3 (512 slots) gate_up_wgrad / down_wgrad 28.6 /
        //   12.6 -> 19.3 / 9.6 ms, gpt-oss-20b (2048) 5.04 / 2.30 -> 4.69 / 2.21. _tmastore64 is
        //   faster still in bf16 (qwen3-30b-a3b 3.068 / 1.468 -> 2.968 / 1.432, deepseek-v3
        //   17.874 / 8.957 -> 17.726 / 9.083, with _directarrive on both), but adds an fp32 main
        //   gradient from registers, where _tmastore reduce-adds it by TMA in 64-row slabs: on
        //   deepseek-v3 the register path made the fp32-accumulating step 151.7 ms against 91.0.
        //   _tmastore64 now reduce-adds fp32 by TMA too ([64][64] chunks); until its fp32 step is
        //   measured (docs/performance.md, Open lead 5) these layers keep _tmastore.
        // - Many (mixtral-8x7b, 4096): _tmastore64, which keeps the fourth stage beside 64-column
        //   staging: 16.620 / 7.572 (4-stage register stores) -> 14.062 / 6.568; the whole-tile
        //   staging had lost there (16.14 / 7.43 -> 17.11 / 7.69). fp32 main gradients take the
        //   register epilogue on both.
        // Where TMA stores are illegal (output rows not a multiple of 8 elements), the 4-stage
        // tile with register stores.
        if (family == KernelFamily::down_wgrad)
          if (const auto cute = kernel_layer_tile()) return *cute;
        // gate_up_wgrad on few slots an expert: the kernel layer's 4-stage 128x256 tile (the
        // weight gradients' two-block staging leaves room for the fourth stage) with QuACK's
        // GatherColsMN, against the hand-written tile below (bench/ab.py, H100 SXM;
        // bench/results/2026-12-07-gather-producers-ab/): qwen3-30b-a3b 2.928 -> 2.684 ms,
        // deepseek-v3 16.278 -> 15.502. On many slots (mixtral-8x7b) it lost (12.997 -> 13.492): the hand-written
        // _tmastore64 tile stays there. Where d is a multiple of 256 (whole column tiles) and the
        // tile is legal (a row tile straddling dW1 | dW3 goes out in 64-row pieces). Both weight layouts: the fused
        // [E, 2n, d] one only changes the output maps' expert stride, and grad-checks of it passed
        // on an H100 (skewed hot experts, fp32 accumulation, chunked recompute; qwen3-30b-a3b at
        // T = 4096 in save-h and recompute: 3.83e-3 to 3.87e-3); not timed in that layout.
        if (family == KernelFamily::gate_up_wgrad && few_slots_per_expert(layer, tokens) &&
            layer.shape.hidden % 256 == 0) {
          const TileConfig four = moeblaze::kernel_layer_tile(128, 256, 4, Mainloop::persistent);
          if (legal(four)) return four;
        }
        TileConfig staged = tma(wgmma_tile(128, 256, 3, Mainloop::persistent));
        staged.tma_store = true;
        staged = direct(staged);
        if (few_slots_per_expert(layer, tokens) && legal(staged)) return staged;
        if (const TileConfig blocks = direct(blocks_store_tile()); legal(blocks)) return blocks;
        return tma(wgmma_tile(128, 256, 4, Mainloop::persistent));
      }
      case KernelFamily::gate_up_dgrad:
        if (const auto cute = kernel_layer_tile()) return *cute;
        return slot_rows_tile(Mainloop::warp_specialized);
      case KernelFamily::down_dgrad: {
        // Long reductions (d >= 2048: 32 k-steps of 64 or more): the persistent 128x256 tile,
        // whose mainloop has twice the math per gathered row of the 128x128 one and whose
        // epilogue reads H and writes dA/dB/hg from registers, 16 bytes a lane. down_dgrad ms
        // against the `_wgmma` 128x128 s3: deepseek-v3 (d 7168) 11.33 -> 9.52, mixtral-8x7b (4096)
        // 11.33 -> 10.59, gpt-oss-20b (2880) 3.32 -> 3.22; at d = 2048, with the epilogue's
        // IEEE divides gone and its row loop rolled: olmoe-1b-7b 3.32 -> 2.84, qwen3-30b-a3b
        // 2.46 -> 2.08, qwen3-next-80b 2.20 -> 2.01. Shorter reductions are unmeasured and
        // keep the two-blocks-per-SM tile, whose epilogue overlaps the other block's mainloop.
        // The clamped SwiGLU (GPT-OSS) keeps more values live per element: its epilogue spills
        // 8 bytes on the persistent tile (ptxas, CUDA 13.0), so it stays on the 128x128 one.
        // With _directarrive (above): mixtral-8x7b 8.276 -> 7.815, deepseek-v3 8.558 -> 8.209,
        // qwen3-30b-a3b level (2.147).
        // Where the weights stream (weights_stream: deepseek-v3), the kernel layer's 128x128
        // ping-pong tile (its epilogue under the other warpgroup's mainloop): deepseek-v3 10.610
        // (the M-tile-outer tile below) -> 7.869 ms (bench/ab.py, as the kernel layer's tiles
        // above); it lost on qwen3-30b-a3b (2.202 -> 2.369) and mixtral-8x7b (7.291 -> 8.498).
        if (weights_stream(layer, tokens)) {
          const TileConfig pp = moeblaze::kernel_layer_tile(128, 128, 4, Mainloop::pingpong);
          if (legal(pp)) return pp;
        }
        // Where the weights stream and the layer cannot take that tile, M-tile outer (_altorder),
        // so the blocks in flight share an expert's gathered dy rows: 8.696 -> 8.003 ms
        // (bench/ab.py, the same call; the cluster pair there: 8.474).
        TileConfig wide = tma(wgmma_tile(128, 256, 4, Mainloop::persistent));
        if (wide.tma_contiguous && layer.shape.hidden >= kLongDgradReduction && layer.activation != Activation::clamped_swiglu) {
          wide = direct(wide);
          if (weights_stream(layer, tokens)) {
            TileConfig other_order = wide;
            other_order.alt_order = true;
            if (legal(other_order)) return other_order;
          }
          return wide;
        }
        return wgmma_tile(128, 128, 3);
      }
      // The router GEMMs (one tile per block, cp.async loads). logits = x W_r^T: a 128x256
      // warp-specialised tile where E fills it reads x once per 256 experts (ms, 128x64 `_wgmma`
      // -> 128x256 `_ws`: deepseek-v3 0.416 -> 0.263, qwen3-next-80b 0.434 -> 0.336; at E = 128,
      // qwen3-30b-a3b, 0.145 -> 0.164, so narrower layers keep 128x64).
      case KernelFamily::router_logits:
        return layer.shape.experts >= 256 ? wgmma_tile(128, 256, 4, Mainloop::warp_specialized) : wgmma_tile(128, 64, 4);
      // dW_r = d logits^T x: its k-steps run fastest on the 128x256 `_ws` tile (without splits:
      // deepseek-v3 0.222 (128x64) -> 0.225, qwen3-next-80b 0.271 -> 0.384 over 4x fewer tiles),
      // and the reduction over tokens is split until the tiles fill the GPU (router.cuh).
      case KernelFamily::router_wgrad: return wgmma_tile(128, 256, 4, Mainloop::warp_specialized);
      default: return wgmma_tile(128, 128, 3);
    }
  }
  TileConfig t;  // mma.sync: 128x128x64, 2x4 warps, 3 stages
  switch (family) {
    case KernelFamily::gate_up:
      // Gated: W1 and W3 tiles side by side, so the block covers 2*bn columns.
      if (is_gated(layer.activation)) t = {128, 128, 64, 2, 4, 3};
      else t = {128, 128, 64, 2, 4, 4};
      break;
    case KernelFamily::down_proj:
    case KernelFamily::down_dgrad:
    case KernelFamily::gate_up_dgrad:
    case KernelFamily::down_wgrad:
    case KernelFamily::gate_up_wgrad: t = {128, 128, 64, 2, 4, 4}; break;
    case KernelFamily::router_logits:
    case KernelFamily::router_dgrad:
    case KernelFamily::router_wgrad: t = {128, 64, 64, 4, 2, 3}; break;
    default: break;
  }
  return t;
}

std::vector<KernelSpec> layer_kernel_specs(const LayerConfig& layer, Arch arch, int64_t tokens) {
  std::vector<KernelSpec> specs;
  for (KernelFamily f : all_families()) {
    if (!family_runs(f, layer)) continue;
    specs.push_back(KernelSpec{f, layer, default_tile(f, layer, arch, tokens), arch});
  }
  return specs;
}

}  // namespace moeblaze
