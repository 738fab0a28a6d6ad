// The router's GEMMs (templates/moeblaze/router.cuh): the logits and their two gradients. Not
// on the kernel layer, and not in the cost model.
#include "families.hpp"

namespace moeblaze::families {
namespace {

double logits_min_bytes(const LayerConfig& l, int64_t tokens) {
  const auto [T, TK, d, n, E, G, W] = step_sizes(l, tokens);
  return T * d * 2 + E * d * 2 + T * E * 4;  // x; W_r; fp32 logits
}

}  // namespace

const FamilyDef& router_logits() {
  static const FamilyDef def = {KernelFamily::router_logits, "logits = x W_r^T: M = the tokens, N = E, K = d",
                                RowKind::tokens, GemmDim::tokens, GemmDim::experts, GemmDim::hidden,
                                logits_min_bytes, false, 0, 0, false, false, nullptr};
  return def;
}

const FamilyDef& router_dgrad() {
  static const FamilyDef def = {KernelFamily::router_dgrad, "dx = d logits W_r: M = the tokens, N = d, K = E",
                                RowKind::tokens, GemmDim::tokens, GemmDim::hidden, GemmDim::experts,
                                nullptr, false, 0, 0, false, false, nullptr};
  return def;
}

const FamilyDef& router_wgrad() {
  static const FamilyDef def = {KernelFamily::router_wgrad,
                                "dW_r = d logits^T x: M = E, N = d, K = the tokens (in router_wgrad_splits parts)",
                                RowKind::experts, GemmDim::experts, GemmDim::hidden, GemmDim::tokens,
                                nullptr, false, 0, 0, false, false, nullptr};
  return def;
}

}  // namespace moeblaze::families
