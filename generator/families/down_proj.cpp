// down_proj: o = h W2^T, each slot's row of the expert's output (combined per token later).
#include <fmt/format.h>

#include "families.hpp"

namespace moeblaze::families {
namespace {

double min_bytes(const LayerConfig& l, int64_t tokens) {
  const auto [T, TK, d, n, E, G, W] = step_sizes(l, tokens);
  return TK * n * 2 + W + TK * d * 2;  // h; W2; o
}

std::string shape_arguments(const KernelSpec& s) {
  const MoeShape& m = s.layer.shape;
  return fmt::format("{}, {}, {}, {}", m.experts, m.hidden, m.ffn, bool_literal(s.tile.alt_order));
}

std::string problem(const KernelSpec& s) {
  if (s.layer.expert_bias) return "the kernel layer's down_proj does not add expert biases yet";
  return {};
}

const KernelLayerDef kLayer = {"moeblaze/sm90/down_proj.cuh", "moeblaze::sm90::down_proj", false, false,
                               accumulator_tile_bytes, shape_arguments, no_problem, problem};

}  // namespace

const FamilyDef& down_proj() {
  static const FamilyDef def = {KernelFamily::down_proj,
                                "o = h W2^T: M = each expert's slots (h rows), N = d, K = n", RowKind::expert_slots,
                                GemmDim::slots, GemmDim::hidden, GemmDim::ffn,
                                min_bytes, true, 0, 1, false, false, &kLayer};
  return def;
}

}  // namespace moeblaze::families
