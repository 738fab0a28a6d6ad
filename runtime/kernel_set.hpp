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
  std::unique_ptr<LoadedModule> loaded;  // null until load()
};

// Compiles every spec with NVRTC using up to `threads` threads (0 = hardware threads).
// The first failure is rethrown after all threads finish.
std::vector<BuiltKernel> compile_all(const std::vector<KernelSpec>& specs, unsigned threads = 0);

class KernelSet {
 public:
  // Generates and compiles every kernel of `layer` (default tiles unless `tiles` names one).
  static KernelSet compile(const LayerConfig& layer, const std::string& arch,
                           const std::map<KernelFamily, TileConfig>& tiles = {});
  // Loads every cubin into the current context (needs a GPU).
  void load();
  bool loaded() const;

  const BuiltKernel& get(KernelFamily f) const;
  const std::vector<BuiltKernel>& kernels() const { return kernels_; }
  const LayerConfig& layer() const { return layer_; }

  // Launches a loaded kernel: 1-D grid, its block size and dynamic shared memory, one
  // argument struct passed by value.
  template <class Args>
  void launch(KernelFamily f, long long grid, const Args& args, CUstream stream) const {
    launch_raw(f, grid, const_cast<Args*>(&args), stream);
  }

 private:
  void launch_raw(KernelFamily f, long long grid, void* args, CUstream stream) const;
  LayerConfig layer_;
  std::vector<BuiltKernel> kernels_;
};

}  // namespace moeblaze
