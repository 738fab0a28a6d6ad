// Device buffers for timing a layer: random inputs (never zeros), weights, outputs, saved
// state and scratch, with the activation inputs (x, dy) rotated over enough copies that
// the working set exceeds twice the L2. Used by the tuner, the benchmark and regress.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/moe_layer.hpp"

namespace moeblaze {

// Routing of a timing run: "router" (the layer's built-in router with random weights, or
// random caller routing when the layer has none), or a caller distribution: "random",
// "balanced", "skewed".
struct TimingWorkspace {
  TimingWorkspace(const LayerConfig& layer, int64_t tokens, const std::string& routing, CheckpointMode mode,
                  uint64_t seed, int64_t l2_bytes);
  TimingWorkspace(const TimingWorkspace&) = delete;
  TimingWorkspace& operator=(const TimingWorkspace&) = delete;

  ForwardArgs forward_args(int rotation) const;
  BackwardArgs backward_args(int rotation) const;
  int rotations() const { return static_cast<int>(x.size()); }

  LayerConfig layer;         // as run: router none when routing is a caller distribution
  int64_t tokens;
  CheckpointMode mode;
  MemoryPlan plan;
  std::vector<DeviceBuffer> x, dy;  // one per rotation
  DeviceBuffer w1, w3, w2, wr, ids, gates, y, dx, dw1, dw3, dw2, dwr, dgates, saved, fscratch, bscratch;
  DeviceBuffer bias_up, bias_down, dbias_up, dbias_down;  // layers with expert biases
  Stream stream;
};

// The layer config a routing choice runs: caller distributions drop the built-in router.
LayerConfig timing_layer(const LayerConfig& layer, const std::string& routing);

}  // namespace moeblaze
