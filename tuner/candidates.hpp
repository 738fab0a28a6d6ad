// Tile candidates per GEMM family for the tuner: a product of block shapes, warp layouts
// and pipeline depths, filtered by the legality rules (shared memory, accumulator
// registers, divisibility), default first. Whether a candidate really fits (registers,
// spills) is decided by its NVRTC resource report; the tuner records those as failures.
#pragma once
#include <vector>

#include "generator/kernel_spec.hpp"

namespace moeblaze {

// The families the tuner measures (every tiled family).
std::vector<KernelFamily> tunable_families(const LayerConfig& layer);

// Candidates for one family, the default tile first, at most `limit` of them.
std::vector<TileConfig> tile_candidates(KernelFamily family, const LayerConfig& layer, Arch arch,
                                        int limit = 16);

}  // namespace moeblaze
