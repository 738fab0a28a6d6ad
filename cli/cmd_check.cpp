// `moeblaze forward-check` and `moeblaze grad-check`: the layer on random data against the
// CPU reference, on a GPU. Non-zero exit on mismatch.
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/json_report.hpp"
#include "core/checked.hpp"
#include "runtime/cache_keys.hpp"
#include "runtime/cuda_driver.hpp"
#include "testing/layer_check.hpp"

namespace moeblaze::cli {
namespace {

double mib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

void print_result(const LayerCheckResult& r, const LayerCheckOptions& o, bool json) {
  const bool ok = r.passed(o.tolerance);
  if (json) {
    nlohmann::json errors = nlohmann::json::array();
    for (const auto& e : r.errors)
      errors.push_back({{"name", e.name}, {"rel_error", e.rel_error}, {"elements", e.elements}, {"exact", e.exact}});
    emit_json({{"layer", r.layer}, {"device", r.device}, {"tokens", r.tokens}, {"mode", to_string(o.mode)},
               {"routing", o.layer.router == RouterKind::none ? to_string(o.routing) : "router"},
               {"forward_ms", r.forward_ms}, {"backward_ms", r.backward_ms}, {"saved_bytes", r.plan.saved_bytes},
               {"h_floor_bytes", r.plan.h_floor_bytes}, {"index_bytes", r.plan.index_bytes},
               {"peak_bytes", r.peak_bytes}, {"all_written", r.all_written},
               {"bitwise_identical", r.bitwise_identical}, {"passed", ok}, {"errors", errors}});
    return;
  }
  fmt::print("{} on {}, T={}, mode {}, routing {}\n", r.layer, r.device, r.tokens, to_string(o.mode),
             o.layer.router == RouterKind::none ? to_string(o.routing) : "built-in router");
  fmt::print("  kernels: {}\n", r.kernels);
  if (r.expert_counts_min_max.size() == 2)
    fmt::print("  tokens per expert: min {} max {}\n", r.expert_counts_min_max[0], r.expert_counts_min_max[1]);
  for (const auto& e : r.errors) {
    const bool line_ok = e.exact ? e.rel_error == 0 : e.rel_error <= o.tolerance;
    if (e.exact) fmt::print("  {:<40} {:>10}  ({} values)\n", e.name, line_ok ? "exact" : "MISMATCH", e.elements);
    else fmt::print("  {:<40} {:>10.3e}  ({} values){}\n", e.name, e.rel_error, e.elements, line_ok ? "" : "  FAIL");
  }
  fmt::print("  every output element written: {}{}\n", r.all_written ? "yes" : "NO: ", r.unwritten);
  fmt::print("  bitwise identical over two runs: {}{}\n", r.bitwise_identical ? "yes" : "NO: ", r.differs);
  fmt::print("  forward {:.3f} ms{}\n", r.forward_ms,
             o.backward ? fmt::format(", backward {:.3f} ms (second run, CUDA events)", r.backward_ms) : "");
  fmt::print("  held between forward and backward: {:.1f} MiB (H floor {:.1f} MiB, index arrays {:.2f} MiB); "
             "peak {:.1f} MiB\n",
             mib(r.plan.saved_bytes), mib(r.plan.h_floor_bytes), mib(r.plan.index_bytes), mib(r.peak_bytes));
  fmt::print("{}: max relative error {:.3e} (tolerance {:.0e})\n", ok ? "PASS" : "FAIL", r.max_error(), o.tolerance);
}

Command check_command(const char* name, const char* help, bool backward) {
  struct State {
    CLI::App* app = nullptr;
    ShapeOptions shape;
    std::string mode = "save-h", routing = "random";
    int samples = 256;
    unsigned long long seed = 1;
    bool json = false, accumulate = false, tuned = false;
    std::string db;
    std::vector<std::string> tiles;
  };
  auto st = std::make_shared<State>();
  Command c;
  c.add = [st, name, help, backward](CLI::App& root) {
    st->app = root.add_subcommand(name, help);
    st->shape.add(st->app, true);
    st->app->add_option("--mode", st->mode, "checkpoint mode: save-h | recompute")->capture_default_str();
    st->app->add_option("--routing", st->routing,
                        "with --router none: random | skewed | balanced | one-hot")->capture_default_str();
    st->app->add_option("--samples", st->samples, "tokens compared with the CPU reference")->capture_default_str();
    st->app->add_option("--seed", st->seed, "random seed")->capture_default_str();
    if (backward) st->app->add_flag("--accumulate-fp32", st->accumulate, "weight gradients added into fp32 buffers");
    st->app->add_flag("--json", st->json, "machine-readable output");
    st->app->add_flag("--tuned", st->tuned, "use the tuned kernels of the cache (else default tiles)");
    st->app->add_option("--db", st->db,
                        "cache file: with --tuned its tuned kernels, else only its compiled binaries of the default "
                        "(or --tile) tiles, so a kernel compiled before is not compiled again (new ones are kept)");
    st->app->add_option("--tile", st->tiles, "FAMILY=TILE: run a family with this tile (e.g. gate_up=128x128x64_w8x1_s3_wgmma)");
  };
  c.selected = [st] { return st->app->parsed(); };
  c.run = [st, backward] {
    LayerCheckOptions o;
    o.layer = st->shape.layer();
    o.tokens = st->shape.token_count(0);
    o.mode = parse_checkpoint_mode(st->mode);
    o.routing = parse_routing(st->routing);
    if (o.routing != RoutingDistribution::random && o.layer.router != RouterKind::none)
      throw InvalidArgument("--routing", "draws the caller's routing: use it with --router none");
    require_in_range(st->samples, 1, kMaxSamples, "--samples");
    o.sample_tokens = st->samples;
    o.seed = st->seed;
    o.backward = backward;
    o.accumulate_fp32 = st->accumulate;
    DeviceContext ctx(0);  // throws NoGpu with the reason when there is none
    std::unique_ptr<KernelCache> cache;
    if (st->tuned || !st->db.empty()) {
      cache = std::make_unique<KernelCache>(st->db.empty() ? KernelCache::default_path() : st->db);
      for (const auto& n : cache->notices()) fmt::print(stderr, "note: {}\n", n);
      o.cache = cache.get();
      o.tuned = st->tuned;
      if (st->tuned) o.policy = measurement_policy(o.layer.router == RouterKind::none ? st->routing : "router");
    }
    o.force = parse_tiles(st->tiles, "--tile");
    const LayerCheckResult r = run_layer_check(o);
    print_result(r, o, st->json);
    return r.passed(o.tolerance) ? 0 : 1;
  };
  return c;
}

}  // namespace

Command forward_check_command() {
  return check_command("forward-check", "run the forward pass on a GPU and compare with the CPU reference", false);
}
Command grad_check_command() {
  return check_command("grad-check", "run forward+backward on a GPU and compare every gradient with the CPU reference",
                       true);
}

}  // namespace moeblaze::cli
