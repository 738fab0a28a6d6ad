#include "measure.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/checked.hpp"
#include "runtime/cache_keys.hpp"
#include "runtime/kernel_timer.hpp"
#include "testing/workspace.hpp"
#include "timing.hpp"

namespace moeblaze {
namespace {

struct StepSamples {
  std::vector<double> fwd, bwd, step;
  std::map<KernelFamily, std::vector<double>> kernels;
};

// Warm-up by time, then `steps` timed forward+backward steps with per-kernel events.
StepSamples time_steps(const MoeLayer& layer, TimingWorkspace& ws, int steps, double warmup_ms) {
  CUstream st = ws.stream.get();
  KernelTimer timer;
  Event e0, e1, e2;
  StepSamples out;
  int rotation = 0;
  auto step = [&](bool timed) {
    ForwardArgs fa = ws.forward_args(rotation % ws.rotations());
    BackwardArgs ba = ws.backward_args(rotation % ws.rotations());
    ++rotation;
    if (timed) fa.observer = ba.observer = &timer;
    e0.record(st);
    const ForwardState s = layer.forward(fa, st);
    e1.record(st);
    layer.backward(s, ba, st);
    e2.record(st);
    e2.synchronize();
    if (!timed) return;
    out.fwd.push_back(Event::elapsed_ms(e0, e1));
    out.bwd.push_back(Event::elapsed_ms(e1, e2));
    out.step.push_back(Event::elapsed_ms(e0, e2));
    for (auto& [f, ms] : timer.collect()) out.kernels[f].push_back(ms);
  };
  const auto t0 = std::chrono::steady_clock::now();
  do step(false);
  while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() < warmup_ms);
  for (int i = 0; i < steps; ++i) step(true);
  return out;
}

DeviceInfo current_device() {
  CUcontext ctx = nullptr;
  MB_CU(cuda_driver().cuCtxGetCurrent(&ctx));
  if (!ctx) throw Error("no CUDA context is current: create a DeviceContext first");
  // DeviceContext holds the details; build them again for the current device 0.
  DeviceContext dc(0);
  return dc.info();
}

// An integer of a baseline read at its full width and range-checked: nlohmann's get<int>
// casts, so "E": 4294967424 would read as 128, and "tokens": 1.5 as 1.
int64_t baseline_integer(const nlohmann::json& object, const char* name, int64_t lo, int64_t hi) {
  const nlohmann::json& v = object.at(name);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    throw InvalidArgument("--baseline", fmt::format("{} = {} is outside [{}, {}]", name, v.dump(), lo, hi));
  if (!v.is_number_integer())
    throw InvalidArgument("--baseline", fmt::format("{} = {} is not an integer", name, v.dump()));
  return require_in_range(v.get<int64_t>(), lo, hi, "--baseline", name);
}

}  // namespace

BenchResult bench_layer(const BenchOptions& o, KernelCache* cache) {
  if (o.steps < 10) throw InvalidArgument("steps", "the median needs at least 10 steps");
  const DeviceInfo dev = current_device();
  TimingWorkspace ws(o.layer, o.tokens, o.routing, o.mode, 11, kTimingL2Bytes);
  BenchResult r;
  r.layer = ws.layer.describe();
  r.device = dev.name;
  r.mode = to_string(o.mode);
  r.routing = o.routing;
  r.tokens = o.tokens;
  LoadOptions lo;
  lo.tokens = o.tokens;
  lo.policy = measurement_policy(o.routing);
  lo.force = o.force;
  auto set = std::make_shared<KernelSet>(load_kernels(ws.layer, dev, cache, lo, &r.load));
  const MoeLayer layer(set);
  const StepSamples s = time_steps(layer, ws, o.steps, o.warmup_ms);
  r.fwd_ms = stats_of(s.fwd).median;
  r.bwd_ms = stats_of(s.bwd).median;
  const Stats step = stats_of(s.step);
  r.step_ms = step.median;
  r.step_spread = step.spread;
  const LayerConfig& l = ws.layer;
  r.tflops = 18.0 * o.tokens * l.shape.topk * l.shape.hidden * l.shape.ffn / (r.step_ms * 1e-3) / 1e12;
  r.plan = layer.memory_plan(o.tokens, o.mode);
  r.peak_bytes = peak_bytes(r.plan, l, o.tokens);
  for (const auto& [f, v] : s.kernels) {
    KernelTime k;
    k.family = to_string(f);
    k.tile = is_tiled(f) ? set->get(f).generated.spec.tile.to_string() : "-";
    const Stats ks = stats_of(v);
    k.ms = ks.median;
    k.spread = ks.spread;
    k.tflops = family_flops(f, l, o.tokens) / (k.ms * 1e-3) / 1e12;
    k.gbps = family_min_bytes(f, l, o.tokens) / (k.ms * 1e-3) / 1e9;
    k.floor_ms = family_floor_ms(f, l, o.tokens);
    r.kernels.push_back(k);
  }
  std::sort(r.kernels.begin(), r.kernels.end(), [](const KernelTime& a, const KernelTime& b) { return a.ms > b.ms; });
  return r;
}

void write_baseline(const Baseline& b, const std::string& path) {
  nlohmann::json j;
  const auto& s = b.layer.shape;
  j["format"] = "moeblaze-baseline-1";
  j["layer"] = {{"E", s.experts},
                {"K", s.topk},
                {"d", s.hidden},
                {"n", s.ffn},
                {"activation", to_string(b.layer.activation)},
                {"router", to_string(b.layer.router)},
                {"renormalize", b.layer.renormalize},
                {"route_scale", b.layer.route_scale}};
  j["tokens"] = b.tokens;
  j["routing"] = b.routing;
  j["device"] = b.device;
  for (const auto& k : b.kernels)
    j["kernels"].push_back({{"family", k.family}, {"tile", k.tile}, {"median_ms", k.median_ms}, {"spread_ms", k.spread_ms}});
  std::ofstream f(path);
  if (!f) throw InvalidArgument("--baseline-out", fmt::format("cannot write '{}'", path));
  f << j.dump(2) << "\n";
  if (!f) throw InvalidArgument("--baseline-out", fmt::format("writing '{}' failed", path));
}

Baseline read_baseline(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw InvalidArgument("--baseline", fmt::format("cannot read '{}'", path));
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.value("format", "") != "moeblaze-baseline-1")
      throw InvalidArgument("--baseline", fmt::format("'{}' is not a moeblaze baseline (format)", path));
    Baseline b;
    const auto& l = j.at("layer");
    b.layer.shape = {int(baseline_integer(l, "E", 1, kMaxExperts)), int(baseline_integer(l, "K", 1, kMaxTopk)),
                     int(baseline_integer(l, "d", 8, kMaxWidth)), int(baseline_integer(l, "n", 8, kMaxWidth))};
    b.layer.activation = parse_activation(l.at("activation").get<std::string>());
    b.layer.router = parse_router(l.at("router").get<std::string>());
    b.layer.renormalize = l.at("renormalize").get<bool>();
    b.layer.route_scale = float(require_finite(l.at("route_scale").get<double>(), 0, kMaxRouteScale, "--baseline", "route_scale"));
    b.layer.validate();
    b.tokens = baseline_integer(j, "tokens", 1, std::numeric_limits<int64_t>::max());
    b.routing = j.at("routing").get<std::string>();
    b.device = j.value("device", "");
    for (const auto& k : j.at("kernels")) {
      BaselineKernel bk{k.at("family").get<std::string>(), k.at("tile").get<std::string>(),
                        k.at("median_ms").get<double>(), k.at("spread_ms").get<double>()};
      // Today's names, so that a baseline written under the older ones compares with the
      // kernels measured now (compare_to_baseline matches families by name).
      bk.family = to_string(parse_family(bk.family));
      if (bk.tile != "-") bk.tile = TileConfig::parse(bk.tile).to_string();
      b.kernels.push_back(bk);
    }
    return b;
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("--baseline", fmt::format("'{}' is not valid baseline JSON: {}", path, e.what()));
  }
}

Baseline measure_kernels(const Baseline& like, int samples, const std::map<KernelFamily, TileConfig>& force,
                         KernelCache* cache) {
  BenchOptions o;
  o.layer = like.layer;
  o.tokens = like.tokens;
  o.routing = like.routing;
  o.steps = std::max(10, samples);
  for (const auto& k : like.kernels)
    if (k.tile != "-") o.force[parse_family(k.family)] = TileConfig::parse(k.tile);
  for (const auto& [f, t] : force) o.force[f] = t;
  const BenchResult r = bench_layer(o, cache);
  Baseline now = like;
  now.device = r.device;
  now.kernels.clear();
  for (const auto& k : r.kernels) now.kernels.push_back({k.family, k.tile, k.ms, k.spread});
  return now;
}

std::vector<RegressLine> compare_to_baseline(const Baseline& base, const Baseline& now, double tolerance) {
  std::vector<RegressLine> out;
  for (const auto& b : base.kernels) {
    RegressLine l;
    l.family = b.family;
    l.baseline_ms = b.median_ms;
    l.baseline_spread = b.spread_ms;
    bool found = false;
    for (const auto& n : now.kernels)
      if (n.family == b.family) {
        l.tile = n.tile;
        l.now_ms = n.median_ms;
        l.now_spread = n.spread_ms;
        found = true;
      }
    l.limit_ms = b.median_ms * (1 + tolerance) + std::max(b.spread_ms, l.now_spread);
    l.slower = !found || l.now_ms > l.limit_ms;
    out.push_back(l);
  }
  return out;
}

}  // namespace moeblaze
