// The kernel layer's tile space per family, generated rather than listed: the product of the
// layer's dimensions (schedule, tile M and N, stages, cluster pair, tile order), each point
// kept or refused by legality_problem with its one-line reason, the legal ones ranked by the
// cost model (generator/cost_model.hpp). The tuner times the first picks, then the
// neighbours of the fastest (tuner/tuner.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cost_model.hpp"
#include "kernel_spec.hpp"

namespace moeblaze {

// One point of the space and why it cannot be built (empty when it can).
struct SpacePoint {
  TileConfig tile;
  std::string refused;
};

// Every point of the family's kernel-layer space for the layer, legal or not, in a fixed
// order. Empty where the kernel layer does not run the family or the target is not sm_90a.
std::vector<SpacePoint> kernel_layer_space(KernelFamily family, const LayerConfig& layer, Arch arch);

struct RankedTile {
  TileConfig tile;
  double predicted_us = 0;
};

// The legal points, fastest predicted first (ties by tile name, so the order is the same on
// every machine).
std::vector<RankedTile> ranked_tiles(KernelFamily family, const LayerConfig& layer, int64_t tokens, Arch arch,
                                     const DeviceModel& device = {});

// The legal points one step from `tile` in one dimension (the next tile size up or down,
// one stage more or less, the other schedule, with or without the pair, the other order),
// ranked as ranked_tiles does.
std::vector<RankedTile> neighbour_tiles(const TileConfig& tile, KernelFamily family, const LayerConfig& layer,
                                        int64_t tokens, Arch arch, const DeviceModel& device = {});

}  // namespace moeblaze
