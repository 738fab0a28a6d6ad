// down_dgrad: dh = gather(dy) W2, with the activation's backward in its epilogue (read H, write
// dA | dB in place and hg).
#include <fmt/format.h>

#include "families.hpp"

namespace moeblaze::families {
namespace {

double min_bytes(const LayerConfig& l, int64_t tokens) {
  const auto [T, TK, d, n, E, G, W] = step_sizes(l, tokens);
  return T * d * 2 + W + TK * n * 2 * G * 2 + TK * n * 2;  // dy; W2; H read, dH written; hg
}

// H's A and B (then dA, dB) and hg: three staging tiles, and their barriers.
int staging_bytes(const KernelSpec& s) { return 3 * accumulator_tile_bytes(s) + 1024; }

std::string shape_arguments(const KernelSpec& s) {
  const MoeShape& m = s.layer.shape;
  return fmt::format("{}, {}, {}, {}, {}, {}", m.experts, m.topk, m.hidden, m.ffn,
                     activation_literal(s.layer.activation), bool_literal(s.tile.alt_order));
}

// Its pair (each block gathering its dy rows, W2 multicast) compiles but faulted on an H100
// (illegal address on mixtral-8x7b, qwen3-30b-a3b and deepseek-v3 at their suite T): refused
// until its staging is read for the pair.
std::string pair_problem(const KernelSpec&) { return kGatheredPairRefusal; }

std::string problem(const KernelSpec& s) {
  if (s.layer.shape.hidden % 64) return "kernel-layer down_dgrad tiles need d % 64 == 0 (W2_e's k stages inside its rows)";
  // Wide-h layers run down dgrad + down wgrad in hg column chunks of a multiple of 256.
  if (s.tile.bn == 192) return "192-wide tiles are not for down_dgrad (its column chunks are multiples of 256)";
  return {};
}

const KernelLayerDef kLayer = {"moeblaze/sm90/down_dgrad.cuh", "moeblaze::sm90::down_dgrad", false, true,
                               staging_bytes, shape_arguments, pair_problem, problem};

}  // namespace

const FamilyDef& down_dgrad() {
  // The epilogue reads H's G parts and writes dH's and hg.
  static const FamilyDef def = {KernelFamily::down_dgrad,
                                "dh = gather(dy) W2: M = each expert's slots (gathered dy rows), N = n, K = d",
                                RowKind::expert_slots, GemmDim::slots, GemmDim::ffn, GemmDim::hidden,
                                min_bytes, true, 2, 1, true, false, &kLayer};
  return def;
}

}  // namespace moeblaze::families
