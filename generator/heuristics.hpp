// Tile heuristics per architecture: the guaranteed default configuration of every GEMM
// family (the tuner measures candidates on top of these).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "generator/kernel_spec.hpp"

namespace moeblaze {

// The configuration used when nothing has been tuned. Always legal for any valid layer.
// tokens: the step's token count where the caller knows it (the runtime's load hint, the
// tuner's T), 0 when not; it picks the weight gradients' epilogue (few_slots_per_expert).
TileConfig default_tile(KernelFamily family, const LayerConfig& layer, Arch arch, int64_t tokens = 0);

// Whether an expert's slots (T K / E, the weight gradients' reduction length) are few enough
// that the whole-tile TMA-store epilogue pays against the 4-stage tiles (at most 2048: 32
// k-steps of 64); with T unknown (0), E / K >= 8 stands in (at most 2048 slots per expert up to
// 16384 tokens). Those layers' weight gradients keep that epilogue for its fp32 path.
bool few_slots_per_expert(const LayerConfig& layer, int64_t tokens);

// Whether an expert's gate/up weights (G n d bf16) are larger than 40 MiB (the H100/H200 L2 holds
// 50 MB): mixtral-8x7b 224 MiB, deepseek-v3 56 MiB.
bool wide_experts(const LayerConfig& layer);

// Whether the experts' weights stream through L2 with little reuse: wide experts with few slots (T K / E
// at most 1024, 8 tiles of 128 rows; with T unknown, E / K >= 16 stands in), so the blocks in
// flight span many weight tiles, each read by few of them (deepseek-v3). Those layers' down_dgrad
// takes the kernel layer's ping-pong tile; wide experts with many slots take gate_up's pair.
bool weights_stream(const LayerConfig& layer, int64_t tokens);

// The columns an expert GEMM's output tiles cover (its N; 0 for the other families).
int output_columns(KernelFamily family, const LayerConfig& layer);

// Whether a 256-wide tile of this family would leave a part-empty last column of tiles that a
// 192-wide one fills (the output's columns a multiple of 192 but not of 256, e.g. gpt-oss-20b's
// 2880 = 15 x 192 = 11.25 x 256).
bool fits_192_better(KernelFamily family, const LayerConfig& layer);

// Every kernel a layer needs (forward and backward, both checkpoint modes), each with its
// default tile; a family that follows another (tile_follows) has its leader's tile.
std::vector<KernelSpec> layer_kernel_specs(const LayerConfig& layer, Arch arch, int64_t tokens = 0);

}  // namespace moeblaze
