#include "kernel_set.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "generator/heuristics.hpp"

namespace moeblaze {

KernelSet KernelSet::compile(const LayerConfig& layer, Arch arch,
                             const std::map<KernelFamily, TileConfig>& tiles) {
  layer.validate();
  std::vector<KernelSpec> specs = layer_kernel_specs(layer, arch);
  for (auto& s : specs)
    if (auto it = tiles.find(s.family); it != tiles.end()) s.tile = it->second;
  tie_following_tiles(specs);
  KernelSet set;
  set.layer_ = layer;
  set.kernels_ = compile_all(specs);
  return set;
}

KernelSet KernelSet::from_kernels(const LayerConfig& layer, std::vector<BuiltKernel> kernels) {
  KernelSet set;
  set.layer_ = layer;
  set.kernels_ = std::move(kernels);
  return set;
}

KernelSet KernelSet::with_kernel(BuiltKernel replacement) const {
  KernelSet set = *this;
  for (auto& k : set.kernels_)
    if (k.generated.spec.family == replacement.generated.spec.family) {
      k = std::move(replacement);
      return set;
    }
  throw Error(fmt::format("kernel {} is not part of this layer", to_string(replacement.generated.spec.family)));
}

void KernelSet::load() {
  for (auto& k : kernels_)
    if (!k.loaded)
      k.loaded = load_module(k);
}

bool KernelSet::loaded() const {
  for (const auto& k : kernels_)
    if (!k.loaded) return false;
  return !kernels_.empty();
}

const BuiltKernel& KernelSet::get(KernelFamily f) const {
  for (const auto& k : kernels_)
    if (k.generated.spec.family == f) return k;
  throw Error(fmt::format("kernel {} is not part of this layer ({})", to_string(f), layer_.describe()));
}

int64_t KernelSet::gemm_tiles(KernelFamily f, const LaunchExtent& extent) const {
  return family_tiles(family_problem(f, layer_, extent), get(f).generated.spec.tile);
}

void KernelSet::launch_raw(KernelFamily f, long long grid, void* args, CUstream stream,
                           LaunchObserver* observer) const {
  if (grid <= 0) return;  // nothing to do (e.g. no tokens routed)
  const BuiltKernel& k = get(f);
  if (!k.loaded) throw Error(fmt::format("kernel {} launched before KernelSet::load()", k.compiled.kernel_name));
  // A persistent kernel walks all `grid` tiles (its schedule ends on the device) with the
  // blocks the GPU holds at once.
  // Cluster pairs walk pair tiles (at most as many as `grid`, the tiles of one block each).
  const int cluster = k.loaded->cluster();
  if (is_tiled(f) && k.generated.spec.tile.persistent())
    grid = std::min<long long>(grid, k.loaded->resident_blocks() / cluster) * cluster;
  if (grid > 0x7fffffffLL) throw Error(fmt::format("kernel {}: grid of {} blocks is too large", to_string(f), grid));
  void* params[] = {args};
  if (observer) observer->before(f, stream);
  k.loaded->launch(static_cast<unsigned>(grid), static_cast<unsigned>(k.generated.threads),
                   static_cast<unsigned>(k.generated.dynamic_smem), stream, params, k.compiled.kernel_name.c_str());
  if (observer) observer->after(f, stream);
}

}  // namespace moeblaze
