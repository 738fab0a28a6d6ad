// `moeblaze bench` (step times with the tuned kernels, per-kernel breakdown) and
// `moeblaze plan` (memory a call needs; no GPU).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cache/kernel_cache.hpp"
#include "cli/commands.hpp"
#include "cli/json_report.hpp"
#include "core/checked.hpp"
#include "generator/heuristics.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/moe_layer.hpp"
#include "tuner/measure.hpp"

namespace moeblaze::cli {

std::string cache_path_option(const std::string& db);
void print_notices(const KernelCache& cache);

namespace {
double mib(size_t b) { return b / 1048576.0; }
}  // namespace

Command bench_command() {
  struct State {
    CLI::App* app = nullptr;
    ShapeOptions shape;
    std::string mode = "save-h", routing = "router", db;
    int steps = 10;
    bool json = false, no_cache = false;
    std::vector<std::string> tiles;
  };
  auto st = std::make_shared<State>();
  Command c;
  c.add = [st](CLI::App& root) {
    st->app = root.add_subcommand("bench", "time forward, backward and the step with the tuned kernels (GPU)");
    st->shape.add(st->app, true);
    st->app->add_option("--mode", st->mode, "save-h | recompute")->capture_default_str();
    st->app->add_option("--routing", st->routing, "router | random | balanced | skewed")->capture_default_str();
    st->app->add_option("--steps", st->steps, "timed steps (median, >= 10)")->capture_default_str();
    st->app->add_option("--db", st->db, "cache file");
    st->app->add_flag("--no-cache", st->no_cache, "default tiles, compiled now (ignore the cache)");
    st->app->add_option("--tile", st->tiles, "FAMILY=TILE: run a family with this tile");
    st->app->add_flag("--json", st->json, "machine-readable report");
  };
  c.selected = [st] { return st->app->parsed(); };
  c.run = [st] {
    BenchOptions o;
    o.layer = st->shape.layer();
    o.tokens = st->shape.token_count(0);
    o.mode = parse_checkpoint_mode(st->mode);
    o.routing = st->routing;
    o.steps = st->steps;
    o.force = parse_tiles(st->tiles, "--tile");
    if (o.steps < 10) throw InvalidArgument("--steps", "at least 10");
    require_in_range(o.steps, 10, kMaxSamples, "--steps");
    require_timing_routing(o.routing, "--routing");
    DeviceContext ctx(0);
    std::unique_ptr<KernelCache> cache;
    if (!st->no_cache) {
      cache = std::make_unique<KernelCache>(cache_path_option(st->db));
      print_notices(*cache);
    }
    const BenchResult r = bench_layer(o, cache.get());
    if (st->json) {
      nlohmann::json j{{"layer", r.layer}, {"device", r.device}, {"tokens", r.tokens}, {"mode", r.mode},
                       {"routing", r.routing}, {"fwd_ms", r.fwd_ms}, {"bwd_ms", r.bwd_ms}, {"step_ms", r.step_ms},
                       {"step_spread_ms", r.step_spread}, {"tflops", r.tflops}, {"saved_bytes", r.plan.saved_bytes},
                       {"h_floor_bytes", r.plan.h_floor_bytes}, {"peak_bytes", r.peak_bytes},
                       {"load", r.load.summary()}, {"kernels", nlohmann::json::array()}};
      for (const auto& k : r.kernels)
        j["kernels"].push_back({{"family", k.family}, {"tile", k.tile}, {"ms", k.ms}, {"spread_ms", k.spread},
                                {"tflops", k.tflops}, {"gbps", k.gbps}, {"floor_ms", k.floor_ms}});
      emit_json(j);
      return 0;
    }
    fmt::print("{} on {}, T={}, mode {}, routing {}\n", r.layer, r.device, r.tokens, r.mode, r.routing);
    fmt::print("kernels: {}\n", r.load.summary());
    fmt::print("forward {:.3f} ms, backward {:.3f} ms, step {:.3f} ms (+-{:.3f}), {:.0f} TFLOP/s (18TKdn/step)\n",
               r.fwd_ms, r.bwd_ms, r.step_ms, r.step_spread, r.tflops);
    fmt::print("held between forward and backward {:.1f} MiB (H floor {:.1f} MiB), peak {:.1f} MiB\n",
               mib(r.plan.saved_bytes), mib(r.plan.h_floor_bytes), mib(r.peak_bytes));
    fmt::print("  {:<16} {:<22} {:>9} {:>9} {:>8} {:>8}\n", "kernel", "tile", "ms/step", "floor ms", "TFLOP/s", "GB/s");
    for (const auto& k : r.kernels)
      fmt::print("  {:<16} {:<22} {:>9.3f} {:>9.3f} {:>8.0f} {:>8.0f}\n", k.family, k.tile, k.ms, k.floor_ms, k.tflops,
                 k.gbps);
    return 0;
  };
  return c;
}

Command plan_command() {
  struct State {
    CLI::App* app = nullptr;
    ShapeOptions shape;
    bool json = false;
  };
  auto st = std::make_shared<State>();
  Command c;
  c.add = [st](CLI::App& root) {
    st->app = root.add_subcommand("plan", "bytes of saved state and scratch a call needs, per checkpoint mode (no GPU)");
    st->shape.add(st->app, true);
    st->app->add_flag("--json", st->json, "machine-readable report");
  };
  c.selected = [st] { return st->app->parsed(); };
  c.run = [st] {
    const LayerConfig l = st->shape.layer();
    const int64_t T = st->shape.token_count(0);
    const int bn = default_tile(KernelFamily::down_dgrad, l, Arch::sm_90a).bn;
    nlohmann::json j;
    if (!st->json) fmt::print("{} T={}\n", l.describe(), T);
    for (CheckpointMode m : {CheckpointMode::save_h, CheckpointMode::recompute}) {
      const MemoryPlan p = plan_memory(l, T, m, bn);
      const size_t peak = peak_bytes(p, l, T);
      if (st->json) {
        j[to_string(m)] = {{"saved_bytes", p.saved_bytes}, {"forward_scratch_bytes", p.forward_scratch_bytes},
                           {"backward_scratch_bytes", p.backward_scratch_bytes}, {"h_floor_bytes", p.h_floor_bytes},
                           {"index_bytes", p.index_bytes}, {"peak_bytes", peak}};
      } else {
        fmt::print("  {:<10} held {:>9.1f} MiB (H floor {:.1f}, index arrays {:.2f})  scratch fwd {:.1f} bwd {:.1f} MiB"
                   "  peak {:.1f} MiB\n",
                   to_string(m), mib(p.saved_bytes), mib(p.h_floor_bytes), mib(p.index_bytes),
                   mib(p.forward_scratch_bytes), mib(p.backward_scratch_bytes), mib(peak));
      }
    }
    if (st->json) emit_json(j);
    return 0;
  };
  return c;
}

}  // namespace moeblaze::cli
