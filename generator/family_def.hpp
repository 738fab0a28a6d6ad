// One home per tiled GEMM family for what the host knows of its GEMM: what it computes, its
// M x N x K for a layer and a step, how many output tiles one launch has, and its flops. The
// runtime's launches (runtime/moe_layer.cpp), the tuner's flop counts (tuner/timing.hpp), the
// cost model and the heuristics read them here rather than restating them.
#pragma once
#include <cstdint>
#include <vector>

#include "kernel_spec.hpp"

namespace moeblaze {

// The sizes a family's GEMM dimensions are made of.
enum class GemmDim {
  slots,      // the step's T K slots (every expert's together), or one forward chunk of them
  tokens,     // T
  hidden,     // d
  ffn,        // n
  gated_ffn,  // G n: the rows of [W1; W3] (G = LayerConfig::gate_parts())
  experts,    // E
};

// What a family's M is; it decides how the output tiles are counted (family_tiles).
enum class RowKind {
  expert_slots,  // each expert's slots, a count only the device knows (ragged): slot tiles
  weight_rows,   // rows of each expert's weight gradient (batch E); K runs over its slots
  tokens,        // the step's tokens (router_logits, router_dgrad)
  experts,       // the experts, which the tiles cover padded to 8 rows (router_wgrad's dW_r)
};

struct FamilyDef {
  KernelFamily family;  // its name is to_string(family)
  const char* gemm;     // what it computes, and its M, N, K in words
  RowKind m_kind;
  GemmDim m, n, k;
};

// One per tiled family (is_tiled), in all_families' order.
const std::vector<FamilyDef>& family_defs();
// Throws InvalidArgument("family", ...) for a family that is no tiled GEMM.
const FamilyDef& family_def(KernelFamily f);

// What one launch covers of a step of `tokens` tokens: all of it, or one chunk of it
// (runtime/moe_layer.cpp: forward_chunks, backward_chunk_cols).
struct LaunchExtent {
  int64_t tokens = 0;
  // A launch over one chunk of the slots (the wide-h forward): the chunk's slots. 0: one
  // launch over all T K slots.
  int64_t slot_chunk = 0;
  // A launch over one chunk of the output columns (the wide-h backward): the chunk's columns.
  // 0: all of N.
  int col_chunk = 0;
  // router_wgrad: the parts its reduction over tokens is split into (router_wgrad_splits),
  // each with its own tiles.
  int splits = 1;
};

// A family's GEMM for one launch: M x N outputs reduced over K, in `batch` groups (the experts;
// 1 for the router GEMMs). A ragged dimension holds its sum over the experts: M of the
// slot-tiled families and K of the weight gradients are the launch's slots together.
struct GemmProblem {
  RowKind m_kind = RowKind::expert_slots;
  int64_t rows = 0;       // M
  int64_t cols = 0;       // N
  int64_t reduction = 0;  // K
  int64_t batch = 1;
  // gate_up's tile holds G parts (W1's and W3's) of bn columns each, so its tiles span N / G.
  int parts = 1;
  bool slot_chunk = false;  // M is one chunk of the slots (LaunchExtent::slot_chunk)
  int splits = 1;           // router_wgrad's reduction parts
  // The columns the output tiles cover: N, or one part's for gate_up.
  int64_t tile_cols() const { return cols / parts; }
};

// The family's GEMM on `layer` for the launch `extent`; with the default extent the
// token-dependent dimensions are 0 (the layer's dimensions alone).
GemmProblem family_problem(KernelFamily f, const LayerConfig& layer, const LaunchExtent& extent = {});

// Blocks of a one-tile-per-block launch: the output tiles, or for slot tiles their bound
// without the per-expert counts (blocks past the real count return at once). A persistent
// kernel walks these tiles with the blocks the GPU holds (KernelSet::launch clamps).
int64_t family_tiles(const GemmProblem& problem, const TileConfig& tile);
int64_t family_tiles(const KernelSpec& spec, const LaunchExtent& extent);

// 2 M N K of a step of `tokens` tokens (every slot once); 0 for the families that are no
// tiled GEMM.
double family_flops(KernelFamily f, const LayerConfig& layer, int64_t tokens);

}  // namespace moeblaze
