// `moeblaze tune` and `moeblaze regress`.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cache/kernel_cache.hpp"
#include "cli/commands.hpp"
#include "cli/json_report.hpp"
#include "core/checked.hpp"
#include "runtime/cuda_driver.hpp"
#include "tuner/candidates.hpp"
#include "tuner/measure.hpp"
#include "tuner/tuner.hpp"

namespace moeblaze::cli {
// Progress on stderr. On a terminal transient lines (counts, estimates) overwrite each other;
// otherwise only the lasting ones (one a phase) are printed, so logs stay short.
std::function<void(const std::string&, bool)> progress_printer(bool quiet) {
  const bool tty = isatty(fileno(stderr));
  return [tty, quiet](const std::string& line, bool transient) {
    if (quiet) return;
    if (tty) {
      fmt::print(stderr, "\r\033[K{}{}", line, transient ? "" : "\n");
      std::fflush(stderr);
    } else if (!transient) {
      fmt::print(stderr, "{}\n", line);
    }
  };
}

std::string cache_path_option(const std::string& db) { return db.empty() ? KernelCache::default_path() : db; }

void require_regular_file(const std::string& path, const char* option) {
  // stat() first: opening a FIFO to read it would wait for a writer forever.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw InvalidArgument(option, fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw InvalidArgument(option, fmt::format("'{}' is not a regular file", path));
}

void print_notices(const KernelCache& cache) {
  for (const auto& n : cache.notices()) fmt::print(stderr, "note: {}\n", n);
}

Command tune_command() {
  struct State {
    CLI::App* app = nullptr;
    ShapeOptions shape;
    std::vector<long long> tokens;
    std::vector<std::string> families;
    std::string db, routing = "router", baseline_out;
    double budget = 300;
    int samples = 10, candidates = 12, widen = 0;
    bool json = false, quiet = false;
  };
  auto st = std::make_shared<State>();
  Command c;
  c.add = [st](CLI::App& root) {
    st->app = root.add_subcommand("tune", "tune the layer's kernels for a shape into the cache (compile-only without a GPU)");
    st->shape.add(st->app, false);
    st->app->add_option("--tokens,-T", st->tokens, "token counts to tune for (default: the preset's T); each is bucketed to a power of two");
    st->app->add_option("--db", st->db, "cache file (default: $MOEBLAZE_CACHE or ~/.cache/moeblaze/kernels.db)");
    st->app->add_option("--budget", st->budget, "seconds of timing (after the candidates are compiled) after which the remaining families keep the default")->capture_default_str();
    st->app->add_option("--routing", st->routing, "router | random | balanced | skewed")->capture_default_str();
    st->app->add_option("--samples", st->samples, "timed samples per candidate (>= 10)")->capture_default_str();
    st->app->add_option("--candidates", st->candidates,
                        "candidates per kernel family (plus the default tile of each token count, if the cut left it out)")
        ->capture_default_str();
    st->app->add_option("--family", st->families,
                        "a tiled kernel family to tune (repeatable; default: every one); the others keep what the cache has. "
                        "With a large --candidates, every legal tile of its space: an exhaustive search");
    st->app->add_option("--widen", st->widen,
                        "rounds of the winner's neighbours (the kernel layer's space) timed after each family's first "
                        "timing, while the budget lasts (not yet run on a GPU); 0: none")
        ->capture_default_str();
    st->app->add_option("--baseline-out", st->baseline_out, "write the tuned kernels' timings as a regress baseline (JSON)");
    st->app->add_flag("--json", st->json, "machine-readable report on stdout");
    st->app->add_flag("--quiet", st->quiet, "no progress lines");
  };
  c.selected = [st] { return st->app->parsed(); };
  c.run = [st] {
    TuneOptions o;
    o.layer = st->shape.layer();
    if (st->tokens.empty()) o.tokens = {st->shape.token_count(0)};
    for (long long t : st->tokens) {
      if (t <= 0) throw InvalidArgument("--tokens", fmt::format("T = {} must be positive", t));
      checked_token_slots(t, o.layer.shape.topk, "--tokens");
      o.tokens.push_back(t);
    }
    require_finite(st->budget, 0, kMaxBudgetSeconds, "--budget");
    if (st->budget <= 0) throw InvalidArgument("--budget", "must be positive");
    if (st->samples < 10) throw InvalidArgument("--samples", "at least 10 (the median of fewer is noise)");
    require_in_range(st->samples, 10, kMaxSamples, "--samples");
    require_in_range(st->candidates, 1, kMaxCandidates, "--candidates");
    require_timing_routing(st->routing, "--routing");
    o.routing = st->routing;
    o.budget_s = st->budget;
    o.samples = st->samples;
    o.candidates_per_family = st->candidates;
    for (const std::string& f : st->families) {
      KernelFamily family;
      try {
        family = parse_family(f);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument("--family", e.reason);
      }
      if (std::find(o.families.begin(), o.families.end(), family) == o.families.end()) o.families.push_back(family);
    }
    require_tunable(o.layer, o.families, "--family");
    require_in_range(st->widen, 0, 16, "--widen");
    o.widen_rounds = st->widen;
    // Progress goes to stderr, so it stays with --json (stdout holds only the report).
    o.progress = progress_printer(st->quiet);
    // Checked before minutes of compiling: the baseline is timed on a GPU.
    std::string no_gpu;
    if (!st->baseline_out.empty() && !gpu_available(&no_gpu)) throw NoGpu("--baseline-out needs timings: " + no_gpu);
    KernelCache cache(cache_path_option(st->db));
    print_notices(cache);
    if (!cache.writable()) throw CacheError(fmt::format("cache {} is read-only: tuning stores into it", cache.path()));
    const TuneReport r = tune_layer(o, cache);
    const std::string shortfall = r.shortfall();
    if (st->json) {
      nlohmann::json j{{"layer", r.layer},       {"device", r.device},       {"policy", r.policy},
                       {"timed", r.timed},        {"why_not_timed", r.why_not_timed},
                       {"candidates", r.candidates}, {"compiled", r.compiled},  {"from_cache", r.from_cache},
                       {"compile_failures", r.compile_failures}, {"compile_errors", r.compile_errors},
                       {"cannot_run", r.cannot_run}, {"not_stored", r.not_stored}, {"cache_error", r.cache_error},
                       {"all_in_cache", shortfall.empty()}, {"shortfall", shortfall},
                       {"step_default_ms", r.step_default_ms}, {"step_tuned_ms", r.step_tuned_ms},
                       {"seconds", r.seconds},    {"compile_seconds", r.compile_seconds}, {"db", cache.path()}, {"families", nlohmann::json::array()}};
      for (const auto& f : r.families)
        j["families"].push_back({{"family", f.family}, {"bucket", f.token_bucket}, {"winner", f.winner},
                                 {"winner_ms", f.winner_ms}, {"default", f.default_tile}, {"default_ms", f.default_ms},
                                 {"candidates", f.candidates}, {"widened", f.widened}, {"failures", f.failures},
                                 {"note", f.note}});
      emit_json(j);
    } else {
      fmt::print("{} into {}\n", r.layer, cache.path());
      fmt::print("compiled {} candidates ({} already cached), {} failed to compile, {} cannot run here (recorded as "
                 "illegal)\n",
                 r.compiled, r.from_cache, r.compile_failures, r.cannot_run);
      if (!r.timed) {
        fmt::print("skipped timing: {}{}\n", r.why_not_timed,
                   shortfall.empty() ? "; every candidate is compiled into the cache" : "");
      } else {
        for (const auto& f : r.families)
          fmt::print("  {:<16} T~{:<6} {:<22} {:>9.3f} ms   default {:<22} {:>9.3f} ms  {}\n", f.family, f.token_bucket,
                     f.winner.empty() ? "-" : f.winner, f.winner_ms, f.default_tile, f.default_ms, f.note);
        fmt::print("step fwd+bwd: default {:.3f} ms, tuned {:.3f} ms ({:.2f}x); {:.0f} s ({:.0f} s compiling) on {}\n",
                   r.step_default_ms, r.step_tuned_ms, r.step_tuned_ms > 0 ? r.step_default_ms / r.step_tuned_ms : 0.0,
                   r.seconds, r.compile_seconds, r.device);
      }
    }
    if (!st->baseline_out.empty()) {
      if (!r.timed) throw NoGpu("--baseline-out needs timings: " + r.why_not_timed);
      Baseline b;
      b.layer = o.layer;
      b.tokens = o.tokens.back();
      b.routing = o.routing;
      // The baseline holds each kernel as a training step runs it (bench-style timing).
      DeviceContext ctx(0);
      KernelCache* cp = &cache;
      BenchOptions bo;
      bo.layer = o.layer;
      bo.tokens = b.tokens;
      bo.routing = o.routing;
      const BenchResult br = bench_layer(bo, cp);
      b.device = br.device;
      for (const auto& k : br.kernels) b.kernels.push_back({k.family, k.tile, k.ms, k.spread});
      write_baseline(b, st->baseline_out);
      if (!st->json) fmt::print("baseline of {} kernels written to {}\n", b.kernels.size(), st->baseline_out);
    }
    // Scripts and CI go by the exit status: a run that left candidates out of the cache failed.
    if (!shortfall.empty()) {
      fmt::print(stderr, "error: tune fell short: {}\n", shortfall);
      return 1;
    }
    return 0;
  };
  return c;
}

Command regress_command() {
  struct State {
    CLI::App* app = nullptr;
    std::string baseline, db;
    double tolerance = 10;
    int samples = 20;
    std::vector<std::string> force;
    bool json = false;
  };
  auto st = std::make_shared<State>();
  Command c;
  c.add = [st](CLI::App& root) {
    st->app = root.add_subcommand("regress", "re-time the kernels of a baseline; exit 1 naming every slower kernel");
    st->app->add_option("--baseline", st->baseline, "baseline file written by `tune --baseline-out`")->required();
    st->app->add_option("--tolerance", st->tolerance, "allowed slowdown in percent, beyond the measured noise")->capture_default_str();
    st->app->add_option("--samples", st->samples, "timed steps (>= 10)")->capture_default_str();
    st->app->add_option("--force", st->force, "FAMILY=TILE: run a family with another tile (to check that regress catches it)");
    st->app->add_option("--db", st->db, "cache file (binaries are loaded from it)");
    st->app->add_flag("--json", st->json, "machine-readable report");
  };
  c.selected = [st] { return st->app->parsed(); };
  c.run = [st] {
    require_regular_file(st->baseline, "--baseline");
    const Baseline base = read_baseline(st->baseline);
    // A baseline is a file anyone can edit: its numbers pass the same checks as options (an
    // infinite or negative time would make every comparison pass or fail).
    checked_token_slots(base.tokens, base.layer.shape.topk, "--baseline");
    for (const auto& k : base.kernels) {
      require_finite(k.median_ms, 0, 1e9, "--baseline", k.family + " median_ms");
      require_finite(k.spread_ms, 0, 1e9, "--baseline", k.family + " spread_ms");
    }
    require_finite(st->tolerance, 0, kMaxTolerancePercent, "--tolerance");
    if (st->samples < 10) throw InvalidArgument("--samples", "at least 10");
    require_in_range(st->samples, 10, kMaxSamples, "--samples");
    const auto force = parse_tiles(st->force, "--force");
    std::string why;
    if (!gpu_available(&why)) {  // CI machines without a GPU pass: README "Exit codes"
      if (st->json)
        emit_json({{"skipped", true}, {"reason", "no GPU here (" + why + ")"}, {"baseline", st->baseline},
                   {"baseline_kernels", base.kernels.size()}, {"kernels", nlohmann::json::array()}, {"slower", 0}});
      else
        fmt::print("regress: skipped, no GPU here ({}); baseline {} has {} kernels\n", why, st->baseline,
                   base.kernels.size());
      return 0;
    }
    DeviceContext ctx(0);
    KernelCache cache(cache_path_option(st->db));
    print_notices(cache);
    const Baseline now = measure_kernels(base, st->samples, force, &cache);
    const auto lines = compare_to_baseline(base, now, st->tolerance / 100.0);
    int slower = 0;
    nlohmann::json j{{"skipped", false}, {"baseline", st->baseline}, {"device", now.device},
                     {"tolerance_percent", st->tolerance}, {"kernels", nlohmann::json::array()}};
    for (const auto& l : lines) {
      slower += l.slower;
      if (st->json)
        j["kernels"].push_back({{"family", l.family}, {"tile", l.tile}, {"baseline_ms", l.baseline_ms},
                                {"now_ms", l.now_ms}, {"limit_ms", l.limit_ms}, {"slower", l.slower}});
      else
        fmt::print("  {:<16} {:<22} baseline {:>8.3f} ms  now {:>8.3f} ms  limit {:>8.3f} ms  {}\n", l.family, l.tile,
                   l.baseline_ms, l.now_ms, l.limit_ms, l.slower ? "SLOWER" : "ok");
    }
    if (st->json) {
      j["slower"] = slower;
      emit_json(j);
    } else {
      fmt::print("{}: {} of {} kernels slower than baseline x {:.0f}% + noise ({} on {})\n",
                 slower ? "REGRESSION" : "OK", slower, lines.size(), 100 + st->tolerance, st->baseline, now.device);
    }
    return slower ? 1 : 0;
  };
  return c;
}

}  // namespace moeblaze::cli
