// Stage 4 with the cache: the kernels of a layer, loaded the way a training process wants
// them: tuned tiles looked up in the cache (exact key, then the same token bucket, then the
// nearest bucket within 2x, then the default), cubins loaded from the cache without NVRTC,
// compiled and stored only on a miss. The report says which path each kernel took.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "kernel_set.hpp"

namespace moeblaze {

enum class TileSource { tuned_exact, tuned_same_bucket, tuned_near_bucket, forced, default_tile };
std::string to_string(TileSource s);

struct KernelChoice {
  KernelFamily family;
  TileConfig tile;
  TileSource tile_source = TileSource::default_tile;
  bool binary_from_cache = false;
  int64_t winner_bucket = 0;  // bucket of the winner used, if any
};

struct LoadReport {
  std::vector<KernelChoice> kernels;
  double total_ms = 0, compile_ms = 0, module_load_ms = 0;
  int cache_hits = 0, compiled = 0;
  // What went wrong with the cache without stopping the load (a winner whose tile does not
  // parse: the default tile instead; a cache that failed to read or write: compiled without
  // it), one line each, each said once.
  std::vector<std::string> warnings;
  std::string summary() const;  // one line
};

// The winner to use for `exact` among winners of the same family, template, shape and
// device (any bucket or policy); nullopt: none applies, use the default.
std::optional<std::pair<Winner, TileSource>> pick_winner(const std::vector<Winner>& winners, const TuningKey& exact);

// Cubins for `specs`: from the cache when present, else compiled in parallel and stored (not
// when the cache is read-only). Compile failures are rethrown (defaults never fail); a cache
// that fails to read or write is left out with a warning in the report; no GPU is needed.
std::vector<BuiltKernel> build_with_cache(const std::vector<KernelSpec>& specs, KernelCache* cache,
                                          LoadReport* report = nullptr);

struct LoadOptions {
  int64_t tokens = 0;
  std::string policy;                          // tuning policy of the exact key
  std::map<KernelFamily, TileConfig> force;    // override the lookup (tests, regress --force)
  // false: the cache's tuned winners are not looked up (default or forced tiles), but its
  // compiled binaries are still used and kept (a check of the defaults that compiles nothing
  // the cache already holds).
  bool tuned = true;
};

// "FAMILY=TILE[,FAMILY=TILE ...]" (commas or spaces): tiles to force, as `bench --tile` takes
// them. The environment variable MOEBLAZE_TILES holds such a list for every layer a process
// loads (below LoadOptions::force): a knob for experiments, e.g. one tile in a training script.
// Throws InvalidArgument(name, ...) on an unknown family or a malformed tile.
std::map<KernelFamily, TileConfig> parse_forced_tiles(const std::string& text, const char* name);

// The specs load_kernels builds: each family's tile looked up in the cache (forced tiles
// first: LoadOptions::force, then MOEBLAZE_TILES; an illegal forced tile throws), the default
// where no usable winner exists; one KernelChoice per spec is appended to r.kernels. No GPU: `fingerprint` is device_fingerprint() of the device the tiles are for.
std::vector<KernelSpec> choose_tiles(const LayerConfig& layer, Arch arch, const std::string& fingerprint,
                                     KernelCache* cache, const LoadOptions& options, LoadReport& r);

// A loaded kernel set for `layer` on the current device. cache may be null (defaults, compiled).
KernelSet load_kernels(const LayerConfig& layer, const DeviceInfo& device, KernelCache* cache,
                       const LoadOptions& options, LoadReport* report = nullptr);

}  // namespace moeblaze
