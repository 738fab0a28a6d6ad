// gate_up_dgrad: dxs = [dA|dB] [W1; W3], each slot's row of the input gradient (summed per token
// later).
#include <fmt/format.h>

#include "families.hpp"

namespace moeblaze::families {
namespace {

double min_bytes(const LayerConfig& l, int64_t tokens) {
  const auto [T, TK, d, n, E, G, W] = step_sizes(l, tokens);
  return TK * n * 2 * G + G * W + TK * d * 2;  // dH; W1 and W3; dxs
}

std::string shape_arguments(const KernelSpec& s) {
  const MoeShape& m = s.layer.shape;
  return fmt::format("{}, {}, {}, {}, {}, {}", m.experts, m.hidden, m.ffn, activation_literal(s.layer.activation),
                     s.layer.w1_rows(), bool_literal(s.tile.alt_order));
}

std::string problem(const KernelSpec& s) {
  if (s.layer.shape.ffn % 64) return "kernel-layer gate_up_dgrad tiles need n % 64 == 0 (W1/W3 k stages inside one matrix)";
  return {};
}

const KernelLayerDef kLayer = {"moeblaze/sm90/gate_up_dgrad.cuh", "moeblaze::sm90::gate_up_dgrad", false, true,
                               accumulator_tile_bytes, shape_arguments, no_problem, problem};

}  // namespace

const FamilyDef& gate_up_dgrad() {
  static const FamilyDef def = {KernelFamily::gate_up_dgrad,
                                "dxs = [dA|dB] [W1; W3]: M = each expert's slots (dH rows), N = d, K = G n",
                                RowKind::expert_slots, GemmDim::slots, GemmDim::hidden, GemmDim::gated_ffn,
                                min_bytes, true, 0, 1, false, false, &kLayer};
  return def;
}

}  // namespace moeblaze::families
