// Stage 4 of the pipeline: the compiled (and, on a GPU, loaded) kernels of one layer, and
// their launch. Kernels come from kernel_build.hpp.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda_driver.hpp"
#include "generator/family_def.hpp"
#include "generator/kernel_spec.hpp"
#include "kernel_build.hpp"

namespace moeblaze {

// Sees every launch of a layer: the tuner and the benchmark time kernels with CUDA events
// recorded around them (no host synchronisation).
struct LaunchObserver {
  virtual ~LaunchObserver() = default;
  virtual void before(KernelFamily family, CUstream stream) = 0;
  virtual void after(KernelFamily family, CUstream stream) = 0;
};

class KernelSet {
 public:
  // Generates and compiles every kernel of `layer` (default tiles unless `tiles` names one).
  static KernelSet compile(const LayerConfig& layer, Arch arch,
                           const std::map<KernelFamily, TileConfig>& tiles = {});
  // A set from already built kernels (one per family the layer needs).
  static KernelSet from_kernels(const LayerConfig& layer, std::vector<BuiltKernel> kernels);
  // The same set with one family's kernel replaced (modules are shared, not reloaded).
  KernelSet with_kernel(BuiltKernel replacement) const;
  // Loads every cubin into the current context (needs a GPU).
  void load();
  bool loaded() const;

  const BuiltKernel& get(KernelFamily f) const;
  const std::vector<BuiltKernel>& kernels() const { return kernels_; }
  const LayerConfig& layer() const { return layer_; }

  // Launches a loaded kernel: 1-D grid, its block size and dynamic shared memory, one
  // argument struct passed by value.
  template <class Args>
  void launch(KernelFamily f, long long grid, const Args& args, CUstream stream,
              LaunchObserver* observer = nullptr) const {
    launch_raw(f, grid, const_cast<Args*>(&args), stream, observer);
  }
  // Launches a tiled family over the output tiles of `extent` (gemm_tiles).
  template <class Args>
  void launch_gemm(KernelFamily f, const LaunchExtent& extent, const Args& args, CUstream stream,
                   LaunchObserver* observer = nullptr) const {
    launch(f, gemm_tiles(f, extent), args, stream, observer);
  }
  // The tiles of one launch of a tiled family: family_tiles of this set's layer and the
  // family's kernel's tile (a persistent kernel then walks them with the blocks the GPU holds).
  int64_t gemm_tiles(KernelFamily f, const LaunchExtent& extent) const;

 private:
  void launch_raw(KernelFamily f, long long grid, void* args, CUstream stream, LaunchObserver* observer) const;
  LayerConfig layer_;
  std::vector<BuiltKernel> kernels_;
};

}  // namespace moeblaze
