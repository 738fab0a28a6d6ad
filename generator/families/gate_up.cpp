// gate_up: [A|B] = gather(x) [W1; W3]^T, H saved and h = act(A) * B written for down_proj.
#include <fmt/format.h>

#include "families.hpp"

namespace moeblaze::families {
namespace {

double min_bytes(const LayerConfig& l, int64_t tokens) {
  const auto [T, TK, d, n, E, G, W] = step_sizes(l, tokens);
  return T * d * 2 + G * W + TK * n * 2 * (G + 1);  // x; W1 and W3; H's parts and h
}

std::string shape_arguments(const KernelSpec& s) {
  const MoeShape& m = s.layer.shape;
  return fmt::format("{}, {}, {}, {}, {}, {}", m.experts, m.hidden, m.ffn, activation_literal(s.layer.activation),
                     s.layer.w1_rows(), bool_literal(s.tile.alt_order));
}

std::string pair_problem(const KernelSpec& s) {
  if (!is_gated(s.layer.activation)) return "a gate_up pair splits W1 | W3 between its blocks: gated activations only";
  return {};
}

std::string problem(const KernelSpec& s) {
  if (s.layer.expert_bias) return "the kernel layer's gate_up does not add expert biases yet";
  if (!is_gated(s.layer.activation)) return "the kernel layer's gate_up runs gated activations (plain ones spill its epilogue)";
  return {};
}

// H, then h, in one staging tile.
const KernelLayerDef kLayer = {"moeblaze/sm90/gate_up.cuh", "moeblaze::sm90::gate_up", false, false,
                               accumulator_tile_bytes, shape_arguments, pair_problem, problem};

}  // namespace

const FamilyDef& gate_up() {
  // The epilogue writes H's G parts and h.
  static const FamilyDef def = {KernelFamily::gate_up,
                                "[A|B] = gather(x) [W1; W3]^T: M = each expert's slots (gathered x rows), N = G n, K = d",
                                RowKind::expert_slots, GemmDim::slots, GemmDim::gated_ffn, GemmDim::hidden,
                                min_bytes, true, 1, 1, true, false, &kLayer};
  return def;
}

}  // namespace moeblaze::families
