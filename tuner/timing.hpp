// What the tuner and the benchmark mean by a time: sample statistics, the L2 the inputs
// rotate past, and the floor each kernel is measured against (its FLOPs at the measured
// GEMM ceiling or its minimum bytes at the measured copy bandwidth, whichever is longer).
#pragma once
#include <cstdint>
#include <vector>

#include "generator/family_def.hpp"
#include "generator/kernel_spec.hpp"

namespace moeblaze {

struct Stats {
  double median = 0, spread = 0;  // spread: (p90 - p10) / 2
  int samples = 0;
};
Stats stats_of(std::vector<double> v);

// The H200's L2: timing inputs rotate over copies that together exceed twice this.
constexpr int64_t kTimingL2Bytes = 60ll << 20;
// Measured on the H200: dense bf16 GEMM and device copy (read + write).
constexpr double kGemmCeilingTflops = 790.0;
constexpr double kCopyCeilingTBps = 4.27;

// A family's FLOPs are family_flops (generator/family_def.hpp); the bytes it must move at
// least are these.
double family_min_bytes(KernelFamily f, const LayerConfig& l, int64_t tokens);
// max(FLOPs / GEMM ceiling, bytes / copy ceiling), in milliseconds.
double family_floor_ms(KernelFamily f, const LayerConfig& l, int64_t tokens);

}  // namespace moeblaze
