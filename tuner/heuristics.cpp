#include "heuristics.hpp"

namespace moeblaze {

TileConfig default_tile(KernelFamily family, const LayerConfig& layer, const std::string& arch) {
  (void)arch;  // one heuristic for sm_80..sm_90a while the kernels are mma.sync based
  TileConfig t;  // 128x128x64, 2x4 warps, 3 stages
  switch (family) {
    case KernelFamily::up_proj:
      // Gated: W1 and W3 tiles side by side, so the block covers 2*bn columns.
      if (is_gated(layer.activation)) t = {128, 128, 64, 2, 4, 3};
      else t = {128, 128, 64, 2, 4, 4};
      break;
    case KernelFamily::down_proj:
    case KernelFamily::down_dgrad:
    case KernelFamily::up_dgrad:
    case KernelFamily::down_wgrad:
    case KernelFamily::up_wgrad: t = {128, 128, 64, 2, 4, 4}; break;
    case KernelFamily::router_logits:
    case KernelFamily::router_dgrad:
    case KernelFamily::router_wgrad: t = {128, 64, 64, 4, 2, 3}; break;
    case KernelFamily::gate_grad: t = default_tile(KernelFamily::down_dgrad, layer, arch); break;
    default: break;
  }
  return t;
}

std::vector<KernelSpec> layer_kernel_specs(const LayerConfig& layer, const std::string& arch) {
  std::vector<KernelSpec> specs;
  for (KernelFamily f : all_families()) {
    const bool router_family = f == KernelFamily::router_logits || f == KernelFamily::router_topk ||
                               f == KernelFamily::router_backward || f == KernelFamily::router_dgrad ||
                               f == KernelFamily::router_wgrad;
    if (router_family && layer.router == RouterKind::none) continue;
    specs.push_back(KernelSpec{f, layer, default_tile(f, layer, arch), arch});
  }
  return specs;
}

}  // namespace moeblaze
