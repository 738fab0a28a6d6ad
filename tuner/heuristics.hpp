// Tile heuristics per architecture: the guaranteed default configuration of every GEMM
// family (the tuner measures candidates on top of these).
#pragma once
#include <string>
#include <vector>

#include "generator/kernel_spec.hpp"

namespace moeblaze {

// The configuration used when nothing has been tuned. Always legal for any valid layer.
TileConfig default_tile(KernelFamily family, const LayerConfig& layer, const std::string& arch);

// Every kernel a layer needs (forward and backward, both checkpoint modes), each with its
// default tile. gate_grad carries down_dgrad's tile (it sums that kernel's N tiles).
std::vector<KernelSpec> layer_kernel_specs(const LayerConfig& layer, const std::string& arch);

}  // namespace moeblaze
