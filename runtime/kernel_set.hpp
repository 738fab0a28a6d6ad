// Stage 3 and 4 of the pipeline: the compiled (and, on a GPU, loaded) kernels of one
// layer, and their launch. Compiles in parallel threads.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda_driver.hpp"
#include "generator/kernel_spec.hpp"
#include "nvrtc_compiler.hpp"

namespace moeblaze {

struct BuiltKernel {
  GeneratedKernel generated;
  CompiledKernel compiled;
  std::shared_ptr<LoadedModule> loaded;  // null until load(); shared by sets that differ elsewhere
  bool from_cache = false;               // cubin came from the cache, not from NVRTC
};

// Sees every launch of a layer: the tuner and the benchmark time kernels with CUDA events
// recorded around them (no host synchronisation).
struct LaunchObserver {
  virtual ~LaunchObserver() = default;
  virtual void before(KernelFamily family, CUstream stream) = 0;
  virtual void after(KernelFamily family, CUstream stream) = 0;
};

// Compiles every spec with NVRTC using up to `threads` threads (0 = hardware threads).
// The first failure is rethrown after all threads finish.
std::vector<BuiltKernel> compile_all(const std::vector<KernelSpec>& specs, unsigned threads = 0,
                                     bool keep_ptx = false);

class KernelSet {
 public:
  // Generates and compiles every kernel of `layer` (default tiles unless `tiles` names one).
  static KernelSet compile(const LayerConfig& layer, const std::string& arch,
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

 private:
  void launch_raw(KernelFamily f, long long grid, void* args, CUstream stream, LaunchObserver* observer) const;
  LayerConfig layer_;
  std::vector<BuiltKernel> kernels_;
};

}  // namespace moeblaze
