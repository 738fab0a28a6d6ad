// Stage 3 of the pipeline: kernel specs -> cubins, with or without the cache. The one place
// that decides how a kernel is obtained: generate its source, look its binary key up in the
// cache, compile the misses with NVRTC in parallel, and store each one as soon as it is
// compiled (a short write; no transaction is open across a compile; nothing is stored in a
// read-only cache). A cache that fails to read or write costs compile time, never the build:
// the call goes on without it and says why (BuildCounts::cache_error).
#pragma once
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
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

// Loads the kernel's cubin into the current context (needs a GPU) with its launch geometry:
// block size, dynamic shared memory and cluster size.
std::shared_ptr<LoadedModule> load_module(const BuiltKernel& kernel);

// How far a build's compiles have come: `done` of `total` NVRTC compiles (cache hits are not
// counted), `seconds` since the first one started.
struct BuildProgress {
  int done = 0, total = 0;
  double seconds = 0;
  // "compiled 37 of 108 kernels, 1m05s, about 1m50s left" (no estimate before the first).
  std::string line(const std::string& what = "kernels") const;
};
using BuildProgressFn = std::function<void(const BuildProgress&)>;

// Where builds whose options name no `progress` report it: one listener for the process (the
// C ABI forwards it to its caller's callback). Empty: none. Set it before builds start.
void set_build_progress_listener(BuildProgressFn listener);

struct BuildOptions {
  KernelCache* cache = nullptr;  // null: compile every kernel, store nothing
  // Compile threads, or child processes where compile_in_processes() (compile_processes.hpp)
  // (0: the hardware's threads; processes: also capped by memory).
  unsigned threads = 0;
  // Also keep each kernel's PTX. Cached binaries have none, so every kernel is compiled
  // (and still stored).
  bool keep_ptx = false;
  // Called once before the first compile (done = 0) and after each compile ends, one call at a
  // time (from the compiling threads); never when every kernel came from the cache. Empty: the
  // process's listener (set_build_progress_listener), if any.
  BuildProgressFn progress{};
};

// What became of one spec: its kernel, or the exception that generating or compiling it threw.
struct KernelBuild {
  std::optional<BuiltKernel> kernel;
  std::exception_ptr error;
  std::string error_text() const;  // the exception's what(), empty when the kernel was built
};

struct BuildCounts {
  int from_cache = 0, compiled = 0, failed = 0;
  // Kernels compiled while a writable cache was given that it did not take: it failed while
  // storing one of them (or a lookup before), and the rest went unstored (cache_error says why).
  int not_stored = 0;
  double compile_ms = 0;    // wall time of the parallel compile (0 when everything was cached)
  std::string cache_error;  // the first cache failure, after which the cache was left out
};

// Every spec's outcome, in spec order. One spec's failure does not stop the others.
std::vector<KernelBuild> build_kernels(const std::vector<KernelSpec>& specs, const BuildOptions& options,
                                       BuildCounts* counts = nullptr);

// Every spec built, in spec order, or the first failure (in spec order) rethrown once all
// have finished.
std::vector<BuiltKernel> build_all(const std::vector<KernelSpec>& specs, const BuildOptions& options,
                                   BuildCounts* counts = nullptr);

// Compiles every spec with NVRTC, no cache: build_all without one.
std::vector<BuiltKernel> compile_all(const std::vector<KernelSpec>& specs, unsigned threads = 0,
                                     bool keep_ptx = false);

}  // namespace moeblaze
