// One home per tiled GEMM family for what the host knows of it: what its GEMM computes, its
// M x N x K for a layer and a step, how many output tiles one launch has, its flops and least
// bytes, what the cost model adds to it, and how the kernel layer instantiates it (template,
// operand majors, staging, template arguments, the family's own legality). Each family's row
// is written in one file, generator/families/<family>.cpp; the runtime's launches
// (runtime/moe_layer.cpp), the tuner's floors (tuner/timing.hpp), the cost model, the kernel
// layer's legality and the heuristics read them here rather than restating them.
#pragma once
#include <cstdint>
#include <string>
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

// How the kernel layer (templates/moeblaze/sm90/, tiles with the _cute suffix) instantiates a
// family: its problem policy's header and kernel function, and the hooks that hold what differs
// from family to family. generator/kernel_layer.cpp composes them with the rules every
// kernel-layer tile shares.
struct KernelLayerDef {
  const char* header;           // the family's problem policy (templates/moeblaze/sm90/)
  const char* function;         // its kernel function template
  bool a_mn_major, b_mn_major;  // operand majors (sm90/config.cuh Major)
  // Bytes of the epilogue's staging (the device epilogue's STAGING_BYTES).
  int (*staging_bytes)(const KernelSpec& spec);
  // The kernel function's template arguments after its KernelConfig: the shape, then the tile order.
  std::string (*shape_arguments)(const KernelSpec& spec);
  // Why a cluster pair (_cluster2x1) of this tile cannot run the family on the layer (empty: it can).
  std::string (*pair_problem)(const KernelSpec& spec);
  // Why the family cannot run the tile on the layer, past the rules every kernel-layer tile
  // shares (empty: it can).
  std::string (*problem)(const KernelSpec& spec);
};

struct FamilyDef {
  KernelFamily family;  // its name is to_string(family)
  const char* gemm;     // what it computes, and its M, N, K in words
  RowKind m_kind;
  GemmDim m, n, k;
  // The least bytes a step of `tokens` tokens moves through DRAM (its operands, its weights and
  // its outputs once: tuner/timing.hpp's floor); nullptr: not counted.
  double (*min_bytes)(const LayerConfig& layer, int64_t tokens);
  // What the cost model (generator/cost_model.hpp) adds to the GEMM, for the expert GEMMs
  // (`modeled`): the epilogue's bf16 traffic per output element, epilogue_per_part G +
  // epilogue_fixed (G = LayerConfig::gate_parts()), and which operand the producer gathers.
  bool modeled;
  int epilogue_per_part, epilogue_fixed;
  bool gathered_a, gathered_b;
  // nullptr where the kernel layer does not run the family.
  const KernelLayerDef* kernel_layer;

  bool gathered() const { return gathered_a || gathered_b; }
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
