// A cost model of the expert GEMMs: how long one launch of a family takes with a given tile on
// a given layer and token count, from the tile's geometry (waves and tail, k-steps, the bytes a
// k-step loads against its math, pipeline depth against latency, the epilogue's bytes, the
// weights' trips from DRAM) and a handful of constants fitted to measured kernel times
// (bench/fit_cost_model.py; the constants live in one table, cost_model.cpp).
//
// The model ranks tiles, it does not replace timing: the tuner times its first picks and
// their neighbours (generator/tile_space.hpp). It knows nothing of the routing beyond the
// slots an expert has on average (T K / E).
#pragma once
#include <cstdint>
#include <string>

#include "kernel_spec.hpp"

namespace moeblaze {

// What the model needs of a GPU. The tuner builds it from the device it runs on
// (device_model_for); without one (compile-only tunes, CI) the H100 SXM stands in.
struct DeviceModel {
  std::string name = "H100 SXM";
  int sms = 132;
  double dram_gb_s = 3350;  // HBM bandwidth, GB/s (H100 SXM 3.35 TB/s, H200 4.8 TB/s)
  double l2_bytes = 50e6;   // what stays resident for reuse between waves
};
// The model of a device by its name (cuDeviceGetName) and SM count: H200 and H100 known, any
// other Hopper part taken as an H100 with its SM count.
DeviceModel device_model_for(const std::string& device_name, int sms);

// The model's terms for one launch, each in microseconds on the busiest SM except `tiles`
// (a count) and `output_kib` (KiB the busiest SM's epilogues write).
struct CostTerms {
  int64_t tiles_total = 0;  // output tiles of the launch (both halves of a pair counted)
  double tiles = 0;         // tiles the busiest SM runs (waves, tail included)
  int k_steps = 0;          // 64-deep k-steps of one tile
  double step_us = 0;       // one k-step: the slowest of its math, its loads and latency / stages
  double mainloop_us = 0;   // tiles x k_steps x step_us
  double output_kib = 0;    // epilogue bytes (outputs written, epilogue operands read)
  double dram_us = 0;       // the launch's DRAM bytes (weights' trips included) over bandwidth
  // Which row of the constants table applies: 0 kernel-layer ping-pong, 1 kernel-layer
  // cooperative, 2 hand-written tiles.
  int tile_class = 0;
};

// The terms of one launch; throws InvalidArgument("family", ...) for a family that is not an
// expert GEMM (the router GEMMs and the index kernels have no model).
CostTerms cost_terms(const KernelSpec& spec, int64_t tokens, const DeviceModel& device);

// The constants the terms are weighed by: one row per tile class, plus the launch and DRAM
// weights. Fitted by bench/fit_cost_model.py; see cost_model.cpp for the data they came from.
struct CostConstants {
  double launch_us;
  double dram;                 // weight of dram_us (the share of DRAM time the mainloop does not hide)
  double mainloop[3];          // 1 / the fraction of the k-step model the class reaches
  double tile_us[3];           // fixed cost of one tile (prologue, pipeline fill, schedule)
  double output_us_per_kib[3]; // the epilogue's cost per KiB the class does not hide
};
const CostConstants& cost_constants();

// The model's time for one launch, microseconds.
double predicted_us(const CostTerms& terms, const CostConstants& c = cost_constants());
double predicted_us(const KernelSpec& spec, int64_t tokens, const DeviceModel& device);

// Whether the model covers the family (the six expert GEMMs).
bool has_cost_model(KernelFamily f);

}  // namespace moeblaze
