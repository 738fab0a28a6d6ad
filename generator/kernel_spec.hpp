// Stage 1 and 2 of the pipeline: (layer, kernel family, tile config) -> instantiation
// source. The generator writes only the glue that names one specialisation of a template
// in templates/; all device code lives there.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "kernel_source.hpp"
#include "layer_config.hpp"

namespace moeblaze {

// The kernels of a layer; docs/design.md lists them ("Kernels") and explains the names that
// need it ("Glossary").
enum class KernelFamily {
  router_logits,    // logits = x W_r^T
  router_topk,      // top-K picks and gates
  index_count,      // index build 1/3
  index_scan,       // index build 2/3
  index_scatter,    // index build 3/3
  gate_up,          // gather(x) [W1;W3]^T, activation epilogue (forward and recompute)
  down_proj,        // h W2^T per slot
  combine,          // token-major gather-sum (y, and dx over a token's K slots)
  down_dgrad,       // gather(dy) W2, activation backward + gate-gradient partials
  gate_grad,        // gate gradient: fixed-order sum of the partials
  down_wgrad,       // dW2
  gate_up_wgrad,    // dW1, dW3
  gate_up_dgrad,    // per-slot dx = [dA|dB] [W1;W3]
  router_backward,  // d logits
  router_dgrad,     // dx += d logits W_r
  router_wgrad,     // dW_r
  bias_grad,        // per-expert bias gradients (layers with expert biases)
  gate_bias_grad,   // the down bias's part of the gate gradient (layers with expert biases)
};

std::string to_string(KernelFamily f);
// Reads to_string's names and the older ones (up_proj, up_wgrad, up_dgrad; docs/design.md,
// "Glossary"), which cache rows, baselines and command lines may still hold; throws
// InvalidArgument("family", ...) listing the families.
KernelFamily parse_family(const std::string& s);
// Every name the family has been written under: to_string's first, then its older one if any
// (the cache's rows hold whichever was current when they were written).
std::vector<std::string> family_names(KernelFamily f);
const std::vector<KernelFamily>& all_families();
// Whether a layer runs the family (router families need the built-in router, bias families
// expert biases).
bool family_runs(KernelFamily f, const LayerConfig& layer);
// Whether the family is a GEMM with a tunable tile configuration.
bool is_tiled(KernelFamily f);
// The family whose tile this family is generated with, if any: gate_grad sums the gate
// partials down_dgrad writes per N tile, so it takes down_dgrad's tile (and its bn decides
// how many partials there are). nullopt for every other family.
std::optional<KernelFamily> tile_follows(KernelFamily f);
// Whether the family uses two stacked B tiles (W1 and W3) for this activation.
int stacked_b_tiles(KernelFamily f, Activation act);

// Tile configuration of a GEMM family (gemm/tile.cuh's gemm::Tile). Its text form is the tile
// name: to_string() writes it, parse() reads it and the older spellings; the glossary in
// docs/design.md ("Glossary") explains every part.
struct TileConfig {
  int bm = 128, bn = 128, bk = 64;
  int warps_m = 2, warps_n = 4;
  int stages = 3;
  // With wgmma warps_n = 1 and warps_m = bm/16 (cooperative), 8 for 256-row warp-specialised
  // tiles (two warpgroups of two m64 slabs), or 4 (ping-pong: one warpgroup per tile): the
  // accumulator layout of wgmma.
  Mainloop mainloop = Mainloop::mma_sync;
  // Every operand that is not gathered (its rows are contiguous) comes by TMA instead of the
  // producer's cp.async copies: warp-specialised tiles of the expert GEMMs.
  bool tma_contiguous = false;
  // The other tile order inside an expert (gemm/scheduler/tile_schedule.cuh): the tuner's
  // schedule-order parameter, for wgmma tiles of the expert GEMMs.
  bool alt_order = false;
  // The output tile leaves through shared memory by TMA stores (weight gradients and the
  // per-slot outputs, on warp-specialised tiles); costs a [bm][bn] bf16 staging buffer of shared
  // memory.
  bool tma_store = false;
  // With tma_store: the tile leaves 64 columns at a time through two [bm][64] buffers in turn
  // instead of one [bm][bn] (32 KiB at bm 128 instead of 64), so a 128x256 tile keeps a fourth
  // stage ("_tmastore64").
  bool tma_store_blocks = false;
  // Warp-specialised pipeline variant: each producer thread's cp.async copies arrive on the
  // consumers' full barrier directly (cp.async.mbarrier.arrive.noinc) and the consumers fence the
  // async proxy after their wait, instead of the producer polling a `landed` barrier, fencing
  // and arriving itself ("_directarrive"; gemm/mainloop/warp_specialized.cuh).
  bool direct_arrive = false;
  // Blocks per thread-block cluster along M (1 or 2): the pair computes the two halves of a
  // 2*bm-row tile and shares its weight operand (launched with cuLaunchKernelEx and a cluster
  // dimension).
  int cluster_m = 1;
  // The kernel layer on CuTe (templates/moeblaze/sm90/: one skeleton over a mainloop, an
  // epilogue and a problem policy) instead of the hand-written mainloops ("_cute"). Ping-pong
  // (_pingpong) or cooperative (_persist) persistent tiles, contiguous operands by TMA
  // (_tmacontig), gathered ones by the producer warpgroup, the output by TMA (_tmastore); its
  // shared memory depends on the family's epilogue (generator/kernel_layer.hpp).
  bool cute = false;
  bool wgmma() const { return uses_wgmma(mainloop); }
  bool warp_specialized() const { return is_warp_specialized(mainloop); }
  bool persistent() const { return is_persistent(mainloop); }
  bool pingpong() const { return mainloop == Mainloop::pingpong; }
  // Consumer groups that each own a tile: 2 in ping-pong, else 1.
  int consumer_groups() const { return pingpong() ? 2 : 1; }
  // The producer: one warpgroup (gemm/tile.cuh's Tile::PRODUCER_THREADS).
  int producer_threads() const { return warp_specialized() ? 128 : 0; }
  // Threads that hold accumulators (and, without a producer, load the tiles).
  int compute_threads() const { return 32 * warps_m * warps_n; }
  // Launch size: the compute threads of every consumer group plus the producer.
  int threads() const { return compute_threads() * consumer_groups() + producer_threads(); }
  // Threads that issue the tile copies.
  int loader_threads() const { return warp_specialized() ? producer_threads() : compute_threads(); }
  // wgmma tiles reserve 1 KiB to align their 128-byte-swizzle atoms to 1024 bytes.
  // (Kernel-layer tiles: kernel_layer_smem_bytes.)
  int smem_bytes(int nb) const {
    return stages * (bm * bk + nb * bn * bk) * 2 + staging_bytes() + (wgmma() ? 1024 : 0);
  }
  // The TMA-store epilogue's staging buffers (gemm/tile.cuh OUT_ELEMS).
  int staging_bytes() const {
    if (!tma_store) return 0;
    return (tma_store_blocks ? 2 * bm * 64 : bm * bn) * 2 * consumer_groups();
  }
  // "128x128x64_w2x4_s3", "128x256x64_w8x1_s4_persist_tmacontig", ...
  std::string to_string() const;
  // Inverse of to_string, also reading the older suffixes (_wg, _wsp, _pp, _tma, _tstore, _swap,
  // _c2), which cache rows, baselines and command lines may still hold; throws
  // InvalidArgument("tile", ...) on a malformed string.
  static TileConfig parse(const std::string& s);
  bool operator==(const TileConfig&) const = default;
};

// An Arch's target name: "sm_90a", or "sm_86" for another SM number. It is NVRTC's
// --gpu-architecture and the arch field of the binary cache keys.
std::string to_string(Arch a);
// Inverse of to_string; throws InvalidArgument("arch", ...) on anything else, "sm_90" included
// (the wgmma tiles need sm_90a's architecture-specific features).
Arch parse_arch(const std::string& s);

struct KernelSpec {
  KernelFamily family;
  LayerConfig layer;
  TileConfig tile;  // meaningful for tiled families only
  Arch arch = Arch::sm_90a;
  std::string name() const;  // unique, readable: the extern "C" symbol
  // Blocks per thread-block cluster the kernel is launched with (1: no clusters; gate_grad
  // carries down_dgrad's tile but is no GEMM).
  int cluster_size() const;
};

// Whether a template header is part of the kernel layer (templates/moeblaze/sm90/), whose
// headers include CUTLASS's (KernelSource::needs_cutlass).
bool header_needs_cutlass(const std::string& header);

// Why a spec cannot be built (empty when it can): the tuner skips such configurations.
std::string legality_problem(const KernelSpec& spec, int max_smem_bytes = 227 * 1024);

// A wgmma tile: bm x bn, `stages` deep, with a wgmma mainloop (any but mma_sync) and the warps
// it takes (bm/16 x 1; 8 x 1 for 256-row warp-specialised tiles; 4 x 1 for ping-pong).
TileConfig wgmma_tile(int bm, int bn, int stages, Mainloop mainloop = Mainloop::wgmma_multistage);
// A persistent ping-pong tile (two consumer warpgroups, each owning a bm x bn tile).
TileConfig pingpong_tile(int bm, int bn, int stages);
// Whether the family can run persistent tiles (the expert GEMMs; the router GEMMs are one
// tile per block).
bool supports_persistent(KernelFamily f);
// Tile widths between QuACK's 64-column steps (96, 160, 208, 224): wgmma takes any multiple of
// 8 up to 256, and a layer whose width they divide (gpt-oss-20b's 2880 = 18 x 160) fills its
// last tile. Legal for the K-major weight tiles of gate_up and down_proj (legality_problem).
bool is_narrow_step_bn(int bn);
// Whether the family's tiles are rows of one expert's slots (gate_up, down_proj, down_dgrad,
// gate_up_dgrad; the weight gradients reduce over the slots instead).
bool is_slot_tiled(KernelFamily f);
// Whether the family can run wgmma tiles (every GEMM family; MN-major operands use wgmma's
// transposed form).
bool supports_wgmma(KernelFamily f);

struct GeneratedKernel {
  KernelSpec spec;
  KernelSource source;
  int threads = 0;       // block size
  int dynamic_smem = 0;  // bytes
};

GeneratedKernel generate(const KernelSpec& spec);

// Gives every spec of a family that follows another (tile_follows) its leader's tile. Call
// after the tiles were chosen (defaults, tuned winners, forced tiles): one rule for all.
void tie_following_tiles(std::vector<KernelSpec>& specs);

// Version of the generator's output format; part of every binary cache key.
constexpr int kGeneratorVersion = 1;

}  // namespace moeblaze
