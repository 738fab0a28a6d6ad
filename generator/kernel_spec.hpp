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

enum class KernelFamily {
  router_logits,    // logits = x W_r^T
  router_topk,      // top-K picks and gates
  index_count,      // index build 1/3
  index_scan,       // index build 2/3
  index_scatter,    // index build 3/3
  up_proj,          // gather(x) [W1;W3]^T, activation epilogue (forward and recompute)
  down_proj,        // h W2^T per slot
  combine,          // token-major gather-sum (y, and dx over a token's K slots)
  down_dgrad,       // gather(dy) W2, activation backward + gate-gradient partials
  gate_grad,        // gate gradient: fixed-order sum of the partials
  down_wgrad,       // dW2
  up_wgrad,         // dW1, dW3
  up_dgrad,         // per-slot dx = [dA|dB] [W1;W3]
  router_backward,  // d logits
  router_dgrad,     // dx += d logits W_r
  router_wgrad,     // dW_r
  bias_grad,        // per-expert bias gradients (layers with expert biases)
  gate_bias_grad,   // the down bias's part of the gate gradient (layers with expert biases)
};

std::string to_string(KernelFamily f);
// Throws InvalidArgument("family", ...) listing the families.
KernelFamily parse_family(const std::string& s);
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

// Tile configuration of a GEMM family (gemm/tile.cuh's gemm::Tile).
struct TileConfig {
  int bm = 128, bn = 128, bk = 64;
  int warps_m = 2, warps_n = 4;
  int stages = 3;
  // Tensor-core path (gemm/tile.cuh's Tile WGMMA_): 0 mma.sync warps; 1 wgmma warpgroups
  // sharing one cp.async pipeline ("_wg"); 2 warp-specialised wgmma: the same consumer
  // warpgroups plus one producer warpgroup ("_ws"); 3 the same, persistent ("_wsp"): a grid of
  // the blocks the GPU holds at once walks the tile schedule, and each block's producer loads
  // the next tile while its consumers run the epilogue; 4 persistent ping-pong ("_pp"): two
  // consumer warpgroups own alternate tiles whole (bm = 64 or 128 rows each), one running its
  // epilogue while the other runs its mainloop (templates/moeblaze/gemm/mainloop/warp_specialized.cuh).
  // With wgmma warps_n = 1 and warps_m = bm/16 (cooperative) or 4 (ping-pong: one warpgroup
  // per tile), the accumulator layout of wgmma.
  int wgmma = 0;
  // Every operand that is not gathered by TMA (cp.async.bulk.tensor, templates/moeblaze/gemm/
  // tma_loaders.cuh) instead of the producer's cp.async copies ("_tma"), on warp-specialised tiles of
  // the expert GEMMs: the weights, h (down_proj), dH (up_dgrad, up_wgrad), hg (down_wgrad).
  bool tma = false;
  // The other tile order of the expert GEMMs ("_swap", gemm/scheduler/tile_schedule.cuh): slot-tiled
  // GEMMs walk N tiles fastest inside an expert (reusing a block of gathered rows), weight
  // gradients run their larger side fastest. The tuner's schedule-order parameter.
  bool swap = false;
  // The output tile leaves through shared memory by TMA stores ("_tstore",
  // templates/moeblaze/gemm/epilogue/tma_store.cuh): the consumers go on to the next tile while it
  // drains. Weight gradients (bf16 outputs; fp32 accumulation keeps the direct stores), on
  // warp-specialised tiles; costs a [bm][bn] bf16 staging buffer of shared memory.
  bool tma_store = false;
  // Blocks per thread-block cluster along M ("_c2": 2): the pair computes the two halves of a
  // 2*bm-row tile and shares its weight operand, each block loading half of every stage by TMA
  // multicast into both (persistent TMA tiles of the slot-tiled expert GEMMs; launched with
  // cuLaunchKernelEx and a cluster dimension).
  int cluster_m = 1;
  bool warp_specialized() const { return wgmma >= 2; }
  bool persistent() const { return wgmma >= 3; }
  bool pingpong() const { return wgmma == 4; }
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
  int smem_bytes(int nb) const {
    return stages * (bm * bk + nb * bn * bk) * 2 + (tma_store ? bm * bn * 2 * consumer_groups() : 0) + (wgmma ? 1024 : 0);
  }
  std::string to_string() const;  // "128x128x64_w2x4_s3", "..._wg" / "..._ws" / "..._wsp" / "..._pp" for wgmma, then "_tma", "_tstore", "_swap", "_c2"
  // Inverse of to_string; throws InvalidArgument("tile", ...) on a malformed string.
  static TileConfig parse(const std::string& s);
  bool operator==(const TileConfig&) const = default;
};

struct KernelSpec {
  KernelFamily family;
  LayerConfig layer;
  TileConfig tile;  // meaningful for tiled families only
  std::string arch = "sm_90a";
  std::string name() const;  // unique, readable: the extern "C" symbol
  // Blocks per thread-block cluster the kernel is launched with (1: no clusters; gate_grad
  // carries down_dgrad's tile but is no GEMM).
  int cluster_size() const;
};

// Why a spec cannot be built (empty when it can): the tuner skips such configurations.
std::string legality_problem(const KernelSpec& spec, int max_smem_bytes = 227 * 1024);

// A wgmma tile for a family that supports it: bm x bn, `stages` deep, warp-specialised
// (producer warpgroup + consumers) or not, persistent (warp-specialised, walking tiles) or not.
TileConfig wgmma_tile(int bm, int bn, int stages, bool warp_specialized = false, bool persistent = false);
// A persistent ping-pong tile (two consumer warpgroups, each owning a bm x bn tile).
TileConfig pingpong_tile(int bm, int bn, int stages);
// Whether the family can run persistent tiles (the expert GEMMs; the router GEMMs are one
// tile per block).
bool supports_persistent(KernelFamily f);
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
