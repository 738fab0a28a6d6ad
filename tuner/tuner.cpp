#include "tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "bf16.hpp"
#include "cache_keys.hpp"
#include "candidates.hpp"
#include "heuristics.hpp"
#include "kernel_loader.hpp"
#include "kernel_timer.hpp"
#include "workspace.hpp"

namespace moeblaze {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Candidate {
  KernelSpec spec;
  std::optional<BuiltKernel> built;
  std::string failure_status, failure;
  std::vector<double> samples;
};

// Compiles (or fetches) every candidate; failures are recorded on the candidate.
void build_candidates(std::vector<Candidate>& cands, KernelCache& cache, TuneReport& rep) {
  std::atomic<size_t> next{0};
  std::mutex m;
  auto worker = [&] {
    for (size_t i = next++; i < cands.size(); i = next++) {
      Candidate& c = cands[i];
      try {
        const GeneratedKernel g = generate(c.spec);
        const std::string key = binary_key(g, CompileOptions{c.spec.arch, {}});
        std::optional<CachedBinary> hit;
        {
          std::lock_guard lock(m);  // one connection, used from one thread at a time
          hit = cache.find_binary(key_hash(key), key);
        }
        if (hit) {
          c.built = from_cached(g, *hit);
          std::lock_guard lock(m);
          ++rep.from_cache;
          continue;
        }
        BuiltKernel b;
        b.generated = g;
        b.compiled = compile_kernel(g.source, CompileOptions{c.spec.arch, {}});
        std::lock_guard lock(m);
        cache.put_binary(to_cached(b, key));  // short write after the compile
        ++rep.compiled;
        if (b.compiled.resources.has_spills()) {
          c.failure_status = "illegal";
          c.failure = fmt::format("spills: {} bytes stack, {}/{} spill store/load", b.compiled.resources.stack_bytes,
                                  b.compiled.resources.spill_store_bytes, b.compiled.resources.spill_load_bytes);
          continue;
        }
        c.built = std::move(b);
      } catch (const std::exception& e) {
        std::lock_guard lock(m);
        c.failure_status = "compile_failed";
        c.failure = e.what();
        c.failure.resize(std::min<size_t>(c.failure.size(), 2000));
        ++rep.compile_failures;
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned n = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), cands.size()));
  for (unsigned t = 0; t < n; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
}

bool is_forward_family(KernelFamily f) {
  return f == KernelFamily::router_logits || f == KernelFamily::up_proj || f == KernelFamily::down_proj;
}

// Device outputs compared between the default and a candidate: y after forward; dx and
// weight gradients (first elements) after backward.
struct Outputs {
  std::vector<bf16> y, dx, dw1, dw2;
  std::vector<float> dg;
};
Outputs read_outputs(const TimingWorkspace& ws, bool backward) {
  auto get = [](const DeviceBuffer& b, size_t max_elems) {
    std::vector<bf16> v(std::min(b.size() / 2, max_elems));
    b.download(v.data(), v.size() * 2);
    return v;
  };
  Outputs o;
  if (!backward) {
    o.y = get(ws.y, size_t(1) << 24);
    return o;
  }
  o.dx = get(ws.dx, size_t(1) << 24);
  o.dw1 = get(ws.dw1, size_t(1) << 22);
  o.dw2 = get(ws.dw2, size_t(1) << 22);
  o.dg.resize(ws.dgates.size() / 4);
  ws.dgates.download(o.dg.data(), ws.dgates.size());
  return o;
}
double rel(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = to_float(a[i]), r = to_float(b[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - r) * (x - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0);
}
double max_rel(const Outputs& a, const Outputs& b) {
  double m = std::max({rel(a.y, b.y), rel(a.dx, b.dx), rel(a.dw1, b.dw1), rel(a.dw2, b.dw2)});
  double num = 0, den = 0;
  for (size_t i = 0; i < a.dg.size(); ++i) {
    num += (a.dg[i] - b.dg[i]) * (a.dg[i] - b.dg[i]);
    den += double(b.dg[i]) * b.dg[i];
  }
  if (!a.dg.empty()) m = std::max(m, den > 0 ? std::sqrt(num / den) : 0.0);
  return m;
}

}  // namespace

TuneReport tune_layer(const TuneOptions& o, KernelCache& cache) {
  const auto t_start = Clock::now();
  auto say = [&](const std::string& s, bool transient = false) {
    if (o.progress) o.progress(s, transient);
  };
  if (o.tokens.empty()) throw InvalidArgument("tokens", "give at least one token count to tune for");
  if (o.samples < 10) throw InvalidArgument("samples", "the median needs at least 10 samples");
  const LayerConfig layer = timing_layer(o.layer, o.routing);
  layer.validate();
  TuneReport rep;
  rep.layer = layer.describe();
  rep.policy = measurement_policy(o.routing);

  std::string why;
  const bool gpu = gpu_available(&why);
  std::unique_ptr<DeviceContext> ctx;
  std::string arch = "sm_90a";
  if (gpu) {
    ctx = std::make_unique<DeviceContext>(0);
    arch = ctx->info().arch();
    rep.device = device_fingerprint(ctx->info());
  }

  // 1. Candidates of every family, compiled into the cache (no GPU needed).
  std::map<KernelFamily, std::vector<Candidate>> cands;
  std::vector<Candidate> flat;
  for (KernelFamily f : tunable_families(layer)) {
    std::vector<TileConfig> tiles = tile_candidates(f, layer, arch, o.candidates_per_family);
    // Each T is timed against what the runtime runs untuned at that T (the weight gradients'
    // default depends on it): that tile is a candidate even where the list was cut before it.
    for (int64_t T : o.tokens) {
      const TileConfig def = default_tile(f, layer, arch, T);
      if (std::find(tiles.begin(), tiles.end(), def) == tiles.end()) tiles.push_back(def);
    }
    for (const TileConfig& t : tiles) flat.push_back(Candidate{KernelSpec{f, layer, t, arch}, std::nullopt, "", "", {}});
  }
  say(fmt::format("compiling {} candidates of {} families for {} ({})", flat.size(), tunable_families(layer).size(),
                  rep.layer, arch));
  build_candidates(flat, cache, rep);
  for (auto& c : flat) cands[c.spec.family].push_back(std::move(c));
  say(fmt::format("compiled {} (cache had {}), {} failed", rep.compiled, rep.from_cache, rep.compile_failures));
  if (!gpu) {
    rep.timed = false;
    rep.why_not_timed = "timing needs a GPU (" + why + "); every candidate is compiled into the cache";
    rep.seconds = seconds_since(t_start);
    return rep;
  }
  rep.timed = true;
  const DeviceInfo& dev = ctx->info();
  const int64_t l2 = 60ll << 20;

  for (int64_t T : o.tokens) {
    const int64_t bucket = token_bucket(T);
    say(fmt::format("tuning T={} (bucket {})", T, bucket));
    TimingWorkspace ws(layer, T, o.routing, CheckpointMode::save_h, o.seed, l2);
    LoadReport lr;
    LoadOptions lo;
    lo.tokens = T;
    for (const auto& s : layer_kernel_specs(layer, arch, T)) lo.force[s.family] = s.tile;
    // Each family's candidate 0 is this T's default (the list has it, above).
    for (auto& [f, cs] : cands) {
      auto it = std::find_if(cs.begin(), cs.end(), [&](const Candidate& c) { return c.spec.tile == lo.force.at(f); });
      if (it != cs.end()) std::rotate(cs.begin(), it, it + 1);
    }
    auto base = std::make_shared<KernelSet>(load_kernels(layer, dev, &cache, lo, &lr));
    const MoeLayer base_layer(base);
    CUstream st = ws.stream.get();
    int rotation = 0;
    ForwardState state;
    // A backward consumes its forward's state (dH is written over the saved H), so a
    // backward-only pass first rebuilds the state with the default forward (untimed).
    auto run = [&](const MoeLayer& l, bool fwd, bool bwd, LaunchObserver* obs, int rot) {
      ForwardArgs fa = ws.forward_args(rot);
      if (!fwd && bwd) state = base_layer.forward(fa, st);
      fa.observer = obs;
      if (fwd) state = l.forward(fa, st);
      if (bwd) {
        BackwardArgs ba = ws.backward_args(rot);
        ba.observer = obs;
        l.backward(state, ba, st);
      }
    };
    // Warm-up by time, then the default's outputs (rotation 0) as the reference.
    const auto tw = Clock::now();
    while (std::chrono::duration<double, std::milli>(Clock::now() - tw).count() < o.warmup_ms) {
      run(base_layer, true, true, nullptr, rotation++ % ws.rotations());
      ws.stream.synchronize();
    }
    run(base_layer, true, false, nullptr, 0);
    ws.stream.synchronize();
    const Outputs ref_fwd = read_outputs(ws, false);
    run(base_layer, false, true, nullptr, 0);
    ws.stream.synchronize();
    const Outputs ref_bwd = read_outputs(ws, true);

    std::map<KernelFamily, TileConfig> chosen;
    // Forward families first, then backward families (each backward on a fresh default forward).
    std::vector<KernelFamily> order;
    for (auto& [f, v] : cands)
      if (is_forward_family(f)) order.push_back(f);
    for (auto& [f, v] : cands)
      if (!is_forward_family(f)) order.push_back(f);
    for (KernelFamily f : order) {
      std::vector<Candidate>& cs = cands[f];
      FamilyTuning ft;
      ft.family = to_string(f);
      ft.token_bucket = bucket;
      ft.default_tile = cs.front().spec.tile.to_string();
      ft.candidates = static_cast<int>(cs.size());
      const TuningKey key = tuning_key(f, layer, bucket, rep.device, rep.policy);
      if (seconds_since(t_start) > o.budget_s) {
        ft.note = "budget exhausted: default kept";
        rep.families.push_back(ft);
        continue;
      }
      const bool fwd = is_forward_family(f);
      // Load and check each candidate against the default's outputs before timing it.
      std::vector<std::unique_ptr<MoeLayer>> layers(cs.size());
      for (size_t i = 0; i < cs.size(); ++i) {
        Candidate& c = cs[i];
        if (!c.built) continue;
        try {
          c.built->loaded = std::make_shared<LoadedModule>(c.built->compiled.cubin, c.built->compiled.kernel_name,
                                                           c.built->generated.dynamic_smem, c.built->generated.threads,
                                                           c.built->generated.spec.cluster_size());
          KernelSet set = base->with_kernel(*c.built);
          if (f == KernelFamily::down_dgrad) {  // gate_grad reads down_dgrad's tiles
            KernelSpec gs{KernelFamily::gate_grad, layer, c.spec.tile, arch};
            auto gg = build_with_cache({gs}, &cache);
            gg[0].loaded = std::make_shared<LoadedModule>(gg[0].compiled.cubin, gg[0].compiled.kernel_name, 0,
                                                          gg[0].generated.threads);
            set = set.with_kernel(gg[0]);
          }
          layers[i] = std::make_unique<MoeLayer>(std::make_shared<KernelSet>(std::move(set)));
          run(*layers[i], fwd, !fwd, nullptr, 0);
          ws.stream.synchronize();
          const double err = max_rel(read_outputs(ws, !fwd), fwd ? ref_fwd : ref_bwd);
          if (!(err <= 1e-2)) {
            c.failure_status = "wrong_result";
            c.failure = fmt::format("relative error {:.3e} against the default kernels", err);
            layers[i].reset();
          }
        } catch (const std::exception& e) {
          c.failure_status = "run_failed";
          c.failure = e.what();
          layers[i].reset();
        }
        if (!layers[i] && c.built)  // say why, so a failing default is diagnosable from the log
          say(fmt::format("  {:<14} {} {}{}: {}", ft.family, c.spec.tile.to_string(), c.failure_status,
                          i == 0 ? " (the default)" : "", c.failure));
      }
      // Interleaved timing: every sample visits every live candidate once (this T's samples
      // only: a candidate list serves every T of the run).
      for (Candidate& c : cs) c.samples.clear();
      KernelTimer timer(f);
      for (int s = 0; s < o.samples; ++s) {
        say(fmt::format("  {:<14} sample {:>2}/{}", ft.family, s + 1, o.samples), true);
        for (size_t i = 0; i < cs.size(); ++i) {
          if (!layers[i]) continue;
          run(*layers[i], fwd, !fwd, &timer, rotation++ % ws.rotations());
          ws.stream.synchronize();
          double ms = 0;
          for (auto& [fam, v] : timer.collect()) ms += v;
          cs[i].samples.push_back(ms);
        }
      }
      // Record everything; pick the winner.
      std::vector<Measurement> ms;
      int best = -1;
      Stats best_stats, def_stats;
      for (size_t i = 0; i < cs.size(); ++i) {
        Measurement m;
        m.key = key;
        m.config = cs[i].spec.tile.to_string();
        if (!layers[i]) {
          m.status = cs[i].failure_status.empty() ? "run_failed" : cs[i].failure_status;
          m.detail = cs[i].failure;
          ++ft.failures;
        } else {
          const Stats s = stats_of(cs[i].samples);
          m.median_ms = s.median;
          m.spread_ms = s.spread;
          m.samples = s.samples;
          if (i == 0) def_stats = s;
          if (best < 0 || s.median < best_stats.median) {
            best = static_cast<int>(i);
            best_stats = s;
          }
        }
        ms.push_back(m);
      }
      cache.add_measurements(ms);
      if (best < 0 || !layers[0]) {
        ft.note = "no candidate ran (default failed?)";
        rep.families.push_back(ft);
        continue;
      }
      // Not significantly faster than the default: keep the default.
      if (def_stats.median - best_stats.median <= std::max(def_stats.spread, best_stats.spread)) {
        best = 0;
        best_stats = def_stats;
      }
      Winner w;
      w.key = key;
      w.config = cs[best].spec.tile.to_string();
      w.median_ms = best_stats.median;
      w.spread_ms = best_stats.spread;
      w.default_ms = def_stats.median;
      cache.put_winner(w);
      chosen[f] = cs[best].spec.tile;
      ft.measured = true;
      ft.winner = w.config;
      ft.winner_ms = best_stats.median;
      ft.winner_spread = best_stats.spread;
      ft.default_ms = def_stats.median;
      ft.default_spread = def_stats.spread;
      say(fmt::format("  {:<14} {} {:.3f} ms (default {} {:.3f} ms, {} candidates, {} failed)", ft.family, w.config,
                      ft.winner_ms, ft.default_tile, ft.default_ms, ft.candidates, ft.failures));
      // Every candidate, fastest first: the side-by-side view (also in the cache's measurements).
      std::vector<const Measurement*> order;
      for (const auto& m : ms) order.push_back(&m);
      std::stable_sort(order.begin(), order.end(), [](const Measurement* a, const Measurement* b) {
        const bool ra = a->status == "ok", rb = b->status == "ok";
        return ra != rb ? ra : ra && a->median_ms < b->median_ms;
      });
      for (const Measurement* m : order)
        say(m->status == "ok" ? fmt::format("      {:<28} {:>9.3f} ms  +-{:.3f}", m->config, m->median_ms, m->spread_ms)
                              : fmt::format("      {:<28} {:>9}     {}", m->config, m->status, m->detail));
      rep.families.push_back(ft);
    }
    // Whole step, default vs tuned, interleaved.
    LoadOptions tl;
    tl.tokens = T;
    tl.policy = rep.policy;
    auto tuned = std::make_shared<KernelSet>(load_kernels(layer, dev, &cache, tl));
    const MoeLayer tuned_layer(tuned);
    std::vector<double> sd, stn;
    Event e0, e1;
    for (int s = 0; s < o.samples; ++s)
      for (int which = 0; which < 2; ++which) {
        e0.record(st);
        run(which ? tuned_layer : base_layer, true, true, nullptr, rotation++ % ws.rotations());
        e1.record(st);
        e1.synchronize();
        (which ? stn : sd).push_back(Event::elapsed_ms(e0, e1));
      }
    rep.step_default_ms = stats_of(sd).median;
    rep.step_tuned_ms = stats_of(stn).median;
    say(fmt::format("step (fwd+bwd) T={}: default {:.3f} ms, tuned {:.3f} ms", T, rep.step_default_ms,
                    rep.step_tuned_ms));
  }
  rep.seconds = seconds_since(t_start);
  return rep;
}

}  // namespace moeblaze
