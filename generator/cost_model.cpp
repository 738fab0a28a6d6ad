#include "cost_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/errors.hpp"
#include "family_def.hpp"

namespace moeblaze {
namespace {

// The k-step model's physical rates, per SM at the clock the H100/H200 hold under a GEMM's
// load (about 1.755 GHz): 4096 dense bf16 flops a clock (989 TFLOP/s at the 1.83 GHz boost over
// 132 SMs) and 64 bytes a clock from L2 into shared memory.
constexpr double kClockGhz = 1.755;
constexpr double kFlopsPerUsPerSm = 4096 * kClockGhz * 1e3;
constexpr double kL2BytesPerUsPerSm = 64 * kClockGhz * 1e3;
// A gathered operand's bytes come by the producer warpgroup's cp.async (an address and a
// predicate a 16-byte copy), slower per byte than a TMA box: weighed this much heavier.
constexpr double kGatherByteWeight = 1.5;
// The time from issuing a stage's loads to their landing (L2 hits and misses mixed), which
// `stages - 1` stages in flight must cover: a k-step cannot be shorter than latency / (stages - 1).
constexpr double kLoadLatencyUs = 1.2;
// The columns' worth of time a wgmma instruction costs beyond its math (see the k-step below).
constexpr double kWgmmaIssueCols = 16;

struct Geometry {
  double rows_per_expert;  // M of one expert's GEMM
  int cols;                // N (gate_up: one part's, the columns its tiles cover)
  int reduction;           // K of the GEMM
  int acc_cols;            // accumulator columns a tile holds (gate_up: its stacked W1 | W3 parts)
  int out_cols;            // output columns a tile covers (gate_up: one part's bn)
  double epilogue_elems;   // bf16 elements an M x N tile's epilogue moves, per output element
  bool gathered_a, gathered_b;
  bool weights_b;          // B is an expert's weights (the slot-tiled GEMMs)
};

// One expert's GEMM, its slots at their average under uniform routing (`slots`): M of the
// slot-tiled families, K of the weight gradients.
Geometry geometry(const KernelSpec& s, int64_t tokens, double slots) {
  const FamilyDef& def = family_def(s.family);
  if (!def.modeled)
    throw InvalidArgument("family", fmt::format("the cost model covers the expert GEMMs, not {}", to_string(s.family)));
  const GemmProblem p = family_problem(s.family, s.layer, {.tokens = tokens});
  const bool slot_rows = p.m_kind == RowKind::expert_slots;
  Geometry g;
  g.rows_per_expert = slot_rows ? slots : double(p.rows);
  g.cols = static_cast<int>(p.tile_cols());
  g.reduction = slot_rows ? static_cast<int>(p.reduction) : int(std::ceil(slots));
  g.acc_cols = p.parts * s.tile.bn;
  g.out_cols = s.tile.bn;
  g.epilogue_elems = double(def.epilogue_per_part * s.layer.gate_parts() + def.epilogue_fixed);
  g.gathered_a = def.gathered_a;
  g.gathered_b = def.gathered_b;
  g.weights_b = slot_rows;
  return g;
}

int tile_class(const TileConfig& t) {
  if (!t.cute) return 2;
  return t.pingpong() ? 0 : 1;
}

// Fitted by bench/fit_cost_model.py (least squares, non-negative) to the per-kernel times of
// the suite runs bench/cost_model_runs.txt names (H100 and H200 runs; every tile that ran there).
const CostConstants kConstants = {
    /*launch_us=*/0,
    /*dram=*/0.1568,
    /*mainloop=*/{1.182, 1.229, 1.325},
    /*tile_us=*/{0, 0, 0.4601},
    /*output_us_per_kib=*/{0.02748, 0.0314, 0.05211},
};

}  // namespace

bool has_cost_model(KernelFamily f) { return is_tiled(f) && family_def(f).modeled; }

DeviceModel device_model_for(const std::string& device_name, int sms) {
  DeviceModel d;
  d.sms = sms > 0 ? sms : d.sms;
  if (device_name.find("H200") != std::string::npos) {
    d.name = "H200";
    d.dram_gb_s = 4800;
  } else if (!device_name.empty()) {
    d.name = device_name;
  }
  return d;
}

const CostConstants& cost_constants() { return kConstants; }

CostTerms cost_terms(const KernelSpec& spec, int64_t tokens, const DeviceModel& device) {
  const TileConfig& t = spec.tile;
  const MoeShape& m = spec.layer.shape;
  if (tokens <= 0) throw InvalidArgument("tokens", "the cost model needs the step's token count (T > 0)");
  const double slots = double(tokens) * m.topk / m.experts;  // an expert's slots, uniform routing
  const Geometry g = geometry(spec, tokens, slots);
  CostTerms c;
  c.tile_class = tile_class(t);
  const int pair = std::max(1, t.cluster_m);
  // Tiles along M come in pairs where the cluster is a pair (an odd one runs with an idle half).
  const int64_t m_tiles = int64_t(std::ceil(g.rows_per_expert / (t.bm * pair))) * pair;
  const int64_t n_tiles = (g.cols + g.out_cols - 1) / g.out_cols;
  c.tiles_total = int64_t(m.experts) * m_tiles * n_tiles;
  c.k_steps = std::max(1, (g.reduction + t.bk - 1) / t.bk);
  // Persistent tiles: the busiest SM runs ceil(tiles / SMs), pairs scheduled on SM pairs. One-tile
  // blocks: as many blocks an SM as its shared memory holds, each wave that many tiles an SM.
  int blocks_per_sm = 1;
  if (!t.persistent()) blocks_per_sm = std::max(1, (227 * 1024) / t.smem_bytes(g.acc_cols / t.bn));
  const double slots_per_wave = double(device.sms) * blocks_per_sm;
  c.tiles = std::ceil(double(c.tiles_total) / slots_per_wave) * blocks_per_sm;
  // One k-step: its math, its loads from L2 (a pair multicasts B: each block issues half),
  // and the latency its stages in flight must cover.
  // A wgmma's fixed issue cost: an m64nNk16 instruction runs at N / (N + kWgmmaIssueCols) of
  // the peak rate (narrow accumulators pay it most).
  const double math_us = 2.0 * t.bm * g.acc_cols * t.bk / kFlopsPerUsPerSm * (g.acc_cols + kWgmmaIssueCols) / g.acc_cols;
  const double a_bytes = double(t.bm) * t.bk * 2 * (g.gathered_a ? kGatherByteWeight : 1.0);
  const double b_bytes = double(g.acc_cols) * t.bk * 2 * (g.gathered_b ? kGatherByteWeight : 1.0) / (g.gathered_b ? 1 : pair);
  const double load_us = (a_bytes + b_bytes) / kL2BytesPerUsPerSm;
  const double latency_us = kLoadLatencyUs / std::max(1, t.stages - 1);
  c.step_us = std::max({math_us, load_us, latency_us});
  c.mainloop_us = c.tiles * c.k_steps * c.step_us;
  c.output_kib = c.tiles * double(t.bm) * g.out_cols * g.epilogue_elems * 2 / 1024;
  // DRAM: the activations once, the outputs once, and each expert's weights once, or once per
  // group of M tiles in flight where they do not stay in L2 (wide experts: the tiles in flight
  // cover SMs / N-tiles M tiles of an expert at a time, a pair two for one load).
  const double total_rows = double(tokens) * m.topk;
  double bytes = 0;
  if (g.weights_b) {
    const double weight_bytes = double(g.cols) * g.reduction * 2;
    const double m_groups = std::max(1.0, double(device.sms) / double(n_tiles));
    const double trips = weight_bytes > device.l2_bytes / 2 ? std::ceil(double(m_tiles) / (m_groups * pair)) : 1.0;
    bytes = total_rows * g.reduction * 2 + m.experts * weight_bytes * trips + total_rows * g.cols * 2 * g.epilogue_elems;
  } else {
    // Weight gradients: both operands are activations (rows x M and rows x N), the output the
    // experts' weight gradients.
    bytes = total_rows * (g.rows_per_expert + g.cols) * 2 + double(m.experts) * g.rows_per_expert * g.cols * 2;
  }
  c.dram_us = bytes / (device.dram_gb_s * 1e3);
  return c;
}

double predicted_us(const CostTerms& x, const CostConstants& c) {
  const int k = x.tile_class;
  return c.launch_us + c.dram * x.dram_us + c.mainloop[k] * x.mainloop_us + c.tile_us[k] * x.tiles +
         c.output_us_per_kib[k] * x.output_kib;
}

double predicted_us(const KernelSpec& spec, int64_t tokens, const DeviceModel& device) {
  return predicted_us(cost_terms(spec, tokens, device));
}

}  // namespace moeblaze
