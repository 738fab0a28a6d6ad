// Measuring a layer with the kernels a training process would load: the benchmark (step
// times, TFLOP/s, memory, per-kernel breakdown against each kernel's floors) and the
// regression check of tuned kernel timings against a baseline file.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/moe_layer.hpp"

namespace moeblaze {

struct BenchOptions {
  LayerConfig layer;
  int64_t tokens = 0;
  CheckpointMode mode = CheckpointMode::save_h;
  std::string routing = "router";
  int steps = 10;            // timed steps (median)
  double warmup_ms = 200;
  std::map<KernelFamily, TileConfig> force;
};

struct KernelTime {
  std::string family, tile;
  double ms = 0, spread = 0, tflops = 0, gbps = 0;  // achieved rates against the kernel's own FLOPs and minimum bytes
  double floor_ms = 0;                   // family_floor_ms (timing.hpp)
};

struct BenchResult {
  std::string layer, device, mode, routing;
  int64_t tokens = 0;
  double fwd_ms = 0, bwd_ms = 0, step_ms = 0, step_spread = 0, tflops = 0;
  MemoryPlan plan;
  size_t peak_bytes = 0;
  LoadReport load;
  std::vector<KernelTime> kernels;  // per step, sorted by time
};

BenchResult bench_layer(const BenchOptions& options, KernelCache* cache);

// A baseline: what `tune --baseline-out` writes and `regress` reads.
struct BaselineKernel {
  std::string family, tile;
  double median_ms = 0, spread_ms = 0;
};
struct Baseline {
  LayerConfig layer;
  int64_t tokens = 0;
  std::string routing = "router", device;
  std::vector<BaselineKernel> kernels;
};
void write_baseline(const Baseline& b, const std::string& path);
Baseline read_baseline(const std::string& path);  // throws InvalidArgument("--baseline", ...)

// Times every kernel of the baseline's configuration (median of `samples` steps) with the
// baseline's tiles (or `force` for some families).
Baseline measure_kernels(const Baseline& like, int samples, const std::map<KernelFamily, TileConfig>& force,
                         KernelCache* cache);

struct RegressLine {
  std::string family, tile;
  double baseline_ms = 0, baseline_spread = 0, now_ms = 0, now_spread = 0, limit_ms = 0;
  bool slower = false;
};
// now > baseline * (1 + tolerance) + max(baseline spread, now spread) is a regression.
std::vector<RegressLine> compare_to_baseline(const Baseline& baseline, const Baseline& now, double tolerance);

}  // namespace moeblaze
