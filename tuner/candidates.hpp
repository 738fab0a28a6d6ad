// Tile candidates per GEMM family for the tuner, default first: the kernel layer's space
// ranked by the cost model for the expert GEMMs, a product of block shapes, warp layouts and
// pipeline depths for the others, filtered by the legality rules (shared memory,
// accumulator registers, divisibility). Whether a candidate really fits (registers,
// spills) is decided by its NVRTC resource report; the tuner records those as failures.
#pragma once
#include <vector>

#include "generator/cost_model.hpp"
#include "generator/kernel_spec.hpp"

namespace moeblaze {

// The families the tuner measures (every tiled family).
std::vector<KernelFamily> tunable_families(const LayerConfig& layer);
// Throws InvalidArgument(argument, ...) naming the first of `families` that is no tiled family
// of the layer, and the ones that are.
void require_tunable(const LayerConfig& layer, const std::vector<KernelFamily>& families, const char* argument);

// The token count the cost model ranks for where the caller gives none (a compile-only fill
// of a cache for every T): the suite's T for the wider layers.
inline constexpr int64_t kModelTokensWithoutT = 16384;

// Candidates for one family, the default tile first, at most `limit` of them. The expert
// GEMMs on sm_90a: the kernel layer's space as the cost model ranks it for T tokens
// (generator/tile_space.hpp); the others: the tiles that won somewhere, then a product of
// block shapes and depths closest to the default.
std::vector<TileConfig> tile_candidates(KernelFamily family, const LayerConfig& layer, Arch arch, int limit = 16,
                                        int64_t tokens = 0, const DeviceModel& device = {});

// Replacements for `lost` listed candidates that cannot run (their kernels spill, or generate
// refuses them): the tiles of `longer` (the same family's list with a larger limit, so `listed`
// is its prefix up to the per-T defaults) that are not listed yet, in its order, at most `lost`.
std::vector<TileConfig> replacement_tiles(const std::vector<TileConfig>& listed, int lost,
                                          const std::vector<TileConfig>& longer);

}  // namespace moeblaze
