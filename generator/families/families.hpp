// The rows of generator/family_def.cpp's table, one file a family (or a group of alike
// families), and what their hooks share. Internal to the generator.
#pragma once
#include <string>

#include "generator/family_def.hpp"

namespace moeblaze::families {

const FamilyDef& gate_up();
const FamilyDef& down_proj();
const FamilyDef& down_dgrad();
const FamilyDef& down_wgrad();
const FamilyDef& gate_up_wgrad();
const FamilyDef& gate_up_dgrad();
const FamilyDef& router_logits();
const FamilyDef& router_dgrad();
const FamilyDef& router_wgrad();

// A step's sizes as doubles, for the families' least-bytes formulas: T tokens, TK slots, d, n, E,
// G gate parts, and W the bytes of one [E, n, d] bf16 weight matrix.
struct StepSizes {
  double T, TK, d, n, E, G, W;
};
inline StepSizes step_sizes(const LayerConfig& l, int64_t tokens) {
  const double T = double(tokens), d = l.shape.hidden, n = l.shape.ffn, E = l.shape.experts;
  return {T, T * l.shape.topk, d, n, E, double(l.gate_parts()), E * n * d * 2};
}

// Template-argument literals.
inline const char* bool_literal(bool v) { return v ? "true" : "false"; }
inline std::string activation_literal(Activation a) { return "moeblaze::Activation::" + to_string(a); }

// One bf16 tile of the accumulator's shape (bm x its columns): the staging of the epilogues that
// stage the whole tile.
int accumulator_tile_bytes(const KernelSpec& spec);
// The staging of the weight gradients' epilogues: two [bm][64] bf16 blocks in turn.
int two_block_staging_bytes(const KernelSpec& spec);
// No rule of the family's own.
std::string no_problem(const KernelSpec& spec);

// What a family whose gathered operand is each block's own cannot share in a pair.
inline constexpr const char* kGatheredPairRefusal =
    "kernel-layer cluster pairs are for the families whose B comes by TMA alone (gate_up, down_proj, gate_up_dgrad, "
    "down_wgrad)";

}  // namespace moeblaze::families
