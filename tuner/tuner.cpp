#include "tuner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string_view>

#include "candidates.hpp"
#include "core/bf16.hpp"
#include "generator/cost_model.hpp"
#include "generator/heuristics.hpp"
#include "generator/tile_space.hpp"
#include "runtime/cache_keys.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/kernel_timer.hpp"
#include "testing/workspace.hpp"
#include "timing.hpp"

namespace moeblaze {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using Say = std::function<void(const std::string&, bool transient)>;

struct Candidate {
  KernelSpec spec;
  std::optional<BuiltKernel> built;
  std::string failure_status, failure;
  std::vector<double> samples;
};
using Candidates = std::map<KernelFamily, std::vector<Candidate>>;

// ---- step 1: every candidate compiled into the cache (no GPU needed) -------------------

// The families a tune times: those named (TuneOptions::families), else every tunable one.
std::vector<KernelFamily> families_to_tune(const TuneOptions& o, const LayerConfig& layer) {
  return o.families.empty() ? tunable_families(layer) : o.families;
}

// The candidate tiles of every tunable family. Each T is timed against what the runtime
// runs untuned at that T (the weight gradients' default depends on it): that tile is a
// candidate even where the list was cut before it.
std::vector<Candidate> list_candidates(const TuneOptions& o, const LayerConfig& layer, Arch arch,
                                       const DeviceModel& model) {
  std::vector<Candidate> flat;
  for (KernelFamily f : families_to_tune(o, layer)) {
    std::vector<TileConfig> tiles = tile_candidates(f, layer, arch, o.candidates_per_family, o.tokens.front(), model);
    for (int64_t T : o.tokens) {
      const TileConfig def = default_tile(f, layer, arch, T);
      if (std::find(tiles.begin(), tiles.end(), def) == tiles.end()) tiles.push_back(def);
    }
    for (const TileConfig& t : tiles) flat.push_back(Candidate{KernelSpec{f, layer, t, arch}, std::nullopt, "", "", {}});
  }
  return flat;
}

// Whether a build failed because the tile cannot run on its target (generate() refuses an
// illegal tile with InvalidArgument("tile")), which is expected, unlike a compile error.
bool is_illegal_tile(const KernelBuild& b) {
  if (!b.error) return false;
  try {
    std::rethrow_exception(b.error);
  } catch (const InvalidArgument& e) {
    return e.argument == "tile";
  } catch (...) {
  }
  return false;
}

// Why a build failed, in one short line: NVRTC's first error line (the same for every kernel
// when the toolkit is broken), else the first line of the exception's message.
std::string failure_reason(const KernelBuild& b) {
  std::string text = b.error_text();
  try {
    std::rethrow_exception(b.error);
  } catch (const CompileError& e) {
    std::istringstream log(e.log);
    for (std::string line; std::getline(log, line);)
      if (line.find("error") != std::string::npos) {
        text = line;
        break;
      }
  } catch (...) {
  }
  std::string line = text.substr(0, text.find('\n'));
  if (line.size() > 240) line = line.substr(0, 240) + "...";
  return line;
}

// Compiles (or fetches) every candidate. A failure, or a kernel that spills, is recorded on
// the candidate and in the report, and never stops the others.
void build_candidates(std::vector<Candidate>& cands, KernelCache& cache, TuneReport& rep, const Say& say) {
  std::vector<KernelSpec> specs;
  for (const Candidate& c : cands) specs.push_back(c.spec);
  BuildCounts counts;
  BuildOptions bo{&cache};
  // A count and an estimate as each compile ends: transient, so a terminal shows one line.
  bo.progress = [&](const BuildProgress& p) { say(p.line("candidates"), true); };
  const auto t0 = Clock::now();
  std::vector<KernelBuild> builds = build_kernels(specs, bo, &counts);
  rep.compile_seconds += seconds_since(t0);
  rep.candidates += static_cast<int>(cands.size());
  rep.compiled += counts.compiled;
  rep.from_cache += counts.from_cache;
  rep.not_stored += counts.not_stored;
  if (rep.cache_error.empty()) rep.cache_error = counts.cache_error;
  for (size_t i = 0; i < cands.size(); ++i) {
    Candidate& c = cands[i];
    if (!builds[i].kernel) {
      const bool illegal = is_illegal_tile(builds[i]);
      c.failure_status = illegal ? "illegal" : "compile_failed";
      c.failure = builds[i].error_text();
      c.failure.resize(std::min<size_t>(c.failure.size(), 2000));
      if (illegal) {
        ++rep.cannot_run;
        continue;
      }
      ++rep.compile_failures;
      const std::string why = failure_reason(builds[i]);
      if (rep.compile_errors.size() < 3 &&
          std::find(rep.compile_errors.begin(), rep.compile_errors.end(), why) == rep.compile_errors.end())
        rep.compile_errors.push_back(why);
      continue;
    }
    const ResourceReport& r = builds[i].kernel->compiled.resources;
    if (r.has_spills()) {
      ++rep.cannot_run;
      c.failure_status = "illegal";
      c.failure = fmt::format("spills: {} bytes stack, {}/{} spill store/load", r.stack_bytes, r.spill_store_bytes,
                              r.spill_load_bytes);
      continue;
    }
    c.built = std::move(builds[i].kernel);
  }
}

// Each candidate that cannot run (a kernel that spills, a tile generate refuses) is replaced
// by the next tile of its family's ranked list, so each family keeps its count of timed
// candidates where the space allows: two rounds at most (a replacement may spill too). The
// spills depend on the shape (phi-3.5-moe's cooperative gate_up tiles spill, qwen3-30b-a3b's do
// not), so no legality rule can drop them before the compile.
void replace_unrunnable(const TuneOptions& o, const LayerConfig& layer, Arch arch, const DeviceModel& model,
                        std::vector<Candidate>& flat, KernelCache& cache, TuneReport& rep, const Say& say) {
  std::map<KernelFamily, int> replaced;
  for (int round = 0; round < 2; ++round) {
    std::vector<Candidate> fresh;
    for (KernelFamily f : families_to_tune(o, layer)) {
      if (!has_cost_model(f)) continue;  // the listed families' lists are not ranked
      std::vector<TileConfig> listed;
      int lost = 0;
      for (const Candidate& c : flat)
        if (c.spec.family == f) {
          listed.push_back(c.spec.tile);
          lost += c.failure_status == "illegal";
        }
      lost -= replaced[f];
      if (lost <= 0) continue;
      const std::vector<TileConfig> longer =
          tile_candidates(f, layer, arch, static_cast<int>(listed.size()) + lost, o.tokens.front(), model);
      for (const TileConfig& t : replacement_tiles(listed, lost, longer)) {
        fresh.push_back(Candidate{KernelSpec{f, layer, t, arch}, std::nullopt, "", "", {}});
        ++replaced[f];
      }
    }
    if (fresh.empty()) return;
    say(fmt::format("compiling {} more candidates in place of those that cannot run", fresh.size()), false);
    build_candidates(fresh, cache, rep, say);
    for (auto& c : fresh) flat.push_back(std::move(c));
  }
}

// ---- the outputs a candidate must reproduce ------------------------------------------

bool is_forward_family(KernelFamily f) {
  return f == KernelFamily::router_logits || f == KernelFamily::gate_up || f == KernelFamily::down_proj;
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

// ---- step 2, per token count: the default kernels, the workspace, their outputs ------

class TokenRun {
 public:
  TokenRun(const TuneOptions& o, const LayerConfig& layer, int64_t T, const DeviceInfo& dev, KernelCache& cache,
           Candidates& cands)
      : ws(layer, T, o.routing, CheckpointMode::save_h, o.seed, kTimingL2Bytes) {
    LoadOptions lo;
    lo.tokens = T;
    for (const auto& s : layer_kernel_specs(layer, dev.arch(), T)) lo.force[s.family] = s.tile;
    // Each family's candidate 0 is this T's default (list_candidates put it in the list).
    for (auto& [f, cs] : cands) {
      auto it = std::find_if(cs.begin(), cs.end(), [&](const Candidate& c) { return c.spec.tile == lo.force.at(f); });
      if (it != cs.end()) std::rotate(cs.begin(), it, it + 1);
    }
    base = std::make_shared<KernelSet>(load_kernels(layer, dev, &cache, lo));
    base_layer = std::make_unique<MoeLayer>(base);
  }

  // One pass of `l` (forward, backward or both) on the next inputs. A backward consumes its
  // forward's state (dH is written over the saved H), so a backward-only pass first rebuilds
  // the state with the default forward (untimed).
  void pass(const MoeLayer& l, bool fwd, bool bwd, LaunchObserver* obs, int rot) {
    CUstream st = ws.stream.get();
    ForwardArgs fa = ws.forward_args(rot);
    if (!fwd && bwd) state_ = base_layer->forward(fa, st);
    fa.observer = obs;
    if (fwd) state_ = l.forward(fa, st);
    if (bwd) {
      BackwardArgs ba = ws.backward_args(rot);
      ba.observer = obs;
      l.backward(state_, ba, st);
    }
  }
  int next_rotation() { return rotation_++ % ws.rotations(); }

  // Warm-up by time, then the default's outputs (rotation 0): what candidates must match.
  void warm_up_and_record_reference(double warmup_ms) {
    const auto tw = Clock::now();
    while (std::chrono::duration<double, std::milli>(Clock::now() - tw).count() < warmup_ms) {
      pass(*base_layer, true, true, nullptr, next_rotation());
      ws.stream.synchronize();
    }
    pass(*base_layer, true, false, nullptr, 0);
    ws.stream.synchronize();
    reference_forward = read_outputs(ws, false);
    pass(*base_layer, false, true, nullptr, 0);
    ws.stream.synchronize();
    reference_backward = read_outputs(ws, true);
  }

  TimingWorkspace ws;
  std::shared_ptr<KernelSet> base;
  std::unique_ptr<MoeLayer> base_layer;
  Outputs reference_forward, reference_backward;

 private:
  ForwardState state_;
  int rotation_ = 0;
};

// ---- step 3, per family: check, time, pick -------------------------------------------

// A candidate that faulted the GPU (an illegal address or instruction, ...) leaves the context
// unusable: every later call fails with the same error, naming whichever kernel it launched. The
// tune stops there, naming the candidate. The fault is stored as the candidate's measurement,
// so a later tune on this device (and these templates: the key holds their hash, so a fixed
// kernel is tried again) skips it and gets past it; the families tuned before keep their
// winners. Its status is "run_failed" with this detail prefix: the cache's schema fixes the
// statuses, and a new one would need every user's cache migrated.
constexpr std::string_view kFaultedDetail = "faulted the GPU: ";

[[noreturn]] void stop_on_fault(const TuningKey& key, const Candidate& c, bool is_default, const CudaError& e,
                                KernelCache& cache) {
  Measurement m;
  m.key = key;
  m.config = c.spec.tile.to_string();
  m.status = "run_failed";
  m.detail = std::string(kFaultedDetail) + e.what();
  std::string stored = "recorded in the cache: the next tune on this device skips it";
  try {
    cache.add_measurements({m});
  } catch (const std::exception& ce) {
    stored = fmt::format("not recorded (the cache failed: {})", ce.what());
  }
  throw Error(fmt::format(
      "{} {} {} faulted the GPU ({}); the context cannot run another kernel, so the tune stops. {}; the "
      "families tuned before it kept their winners.{}",
      key.family, is_default ? "default tile" : "candidate", m.config, e.what(), stored,
      is_default ? " The default itself faulting is a kernel bug in the layer's own path: please report it." : ""));
}

// The configs that faulted the GPU in an earlier tune under this key (this device, shape,
// bucket and templates).
std::set<std::string> faulted_configs(const std::vector<Measurement>& earlier) {
  std::set<std::string> out;
  for (const Measurement& m : earlier)
    if (m.status == "run_failed" && m.detail.rfind(kFaultedDetail, 0) == 0) out.insert(m.config);
  return out;
}

// Loads each built candidate into the default set and checks its outputs against the
// default's before it may be timed; a failure is recorded on the candidate.
// Candidates before `first` keep the layers they have.
void load_and_check(TokenRun& run, KernelFamily f, const TuningKey& key, std::vector<Candidate>& cs, KernelCache& cache,
                    const Say& say, std::vector<std::unique_ptr<MoeLayer>>& layers, size_t first = 0) {
  const bool fwd = is_forward_family(f);
  const std::set<std::string> faulted = faulted_configs(cache.measurements(key.hash()));
  layers.resize(cs.size());
  for (size_t i = first; i < cs.size(); ++i) {
    Candidate& c = cs[i];
    if (!c.built) continue;
    // The default is the reference every candidate is checked against: never skipped.
    if (i > 0 && faulted.count(c.spec.tile.to_string())) {
      c.failure_status = "run_failed";
      c.failure = std::string(kFaultedDetail) + "in an earlier tune on this device: skipped";
      layers[i].reset();
      say(fmt::format("  {:<14} {} skipped: {}", to_string(f), c.spec.tile.to_string(), c.failure), false);
      continue;
    }
    try {
      c.built->loaded = load_module(*c.built);
      KernelSet set = run.base->with_kernel(*c.built);
      // A family that follows this one's tile (gate_grad after down_dgrad) comes with it.
      for (const BuiltKernel& k : run.base->kernels()) {
        const KernelFamily g = k.generated.spec.family;
        if (tile_follows(g) != f) continue;
        KernelSpec follower = k.generated.spec;
        follower.tile = c.spec.tile;
        auto built = build_with_cache({follower}, &cache);
        built[0].loaded = load_module(built[0]);
        set = set.with_kernel(built[0]);
      }
      layers[i] = std::make_unique<MoeLayer>(std::make_shared<KernelSet>(std::move(set)));
      run.pass(*layers[i], fwd, !fwd, nullptr, 0);
      run.ws.stream.synchronize();
      const double err = max_rel(read_outputs(run.ws, !fwd), fwd ? run.reference_forward : run.reference_backward);
      if (!(err <= 1e-2)) {
        c.failure_status = "wrong_result";
        c.failure = fmt::format("relative error {:.3e} against the default kernels", err);
        layers[i].reset();
      }
    } catch (const CudaError& e) {
      if (is_context_fatal(e.code)) stop_on_fault(key, c, i == 0, e, cache);
      c.failure_status = "run_failed";
      c.failure = e.what();
      layers[i].reset();
    } catch (const std::exception& e) {
      c.failure_status = "run_failed";
      c.failure = e.what();
      layers[i].reset();
    }
    if (!layers[i])  // say why, so a failing default is diagnosable from the log
      say(fmt::format("  {:<14} {} {}{}: {}", to_string(f), c.spec.tile.to_string(), c.failure_status,
                      i == 0 ? " (the default)" : "", c.failure),
          false);
  }
}

// Interleaved timing: every sample visits every live candidate once (this T's samples
// only: a candidate list serves every T of the run).
void time_candidates(TokenRun& run, KernelFamily f, const TuningKey& key, std::vector<Candidate>& cs,
                     const std::vector<std::unique_ptr<MoeLayer>>& layers, int samples, KernelCache& cache,
                     const Say& say) {
  const bool fwd = is_forward_family(f);
  for (Candidate& c : cs) c.samples.clear();
  KernelTimer timer(f);
  for (int s = 0; s < samples; ++s) {
    say(fmt::format("  {:<14} sample {:>2}/{}", to_string(f), s + 1, samples), true);
    for (size_t i = 0; i < cs.size(); ++i) {
      if (!layers[i]) continue;
      try {
        run.pass(*layers[i], fwd, !fwd, &timer, run.next_rotation());
        run.ws.stream.synchronize();
      } catch (const CudaError& e) {
        if (is_context_fatal(e.code)) stop_on_fault(key, cs[i], i == 0, e, cache);
        throw;
      }
      double ms = 0;
      for (auto& [fam, v] : timer.collect()) ms += v;
      cs[i].samples.push_back(ms);
    }
  }
}

// Stores every measurement and the winner; a winner must beat the default (candidate 0) by
// more than the noise. Returns false when no candidate ran.
bool record_and_pick(const TuningKey& key, std::vector<Candidate>& cs,
                     const std::vector<std::unique_ptr<MoeLayer>>& layers, KernelCache& cache, FamilyTuning& ft,
                     const Say& say) {
  std::vector<Measurement> ms;
  int best = -1;
  Stats best_stats, def_stats;
  ft.failures = 0;
  ft.candidates = static_cast<int>(cs.size());
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
    return false;
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
  ft.measured = true;
  ft.winner = w.config;
  ft.winner_ms = best_stats.median;
  ft.winner_spread = best_stats.spread;
  ft.default_ms = def_stats.median;
  ft.default_spread = def_stats.spread;
  say(fmt::format("  {:<14} {} {:.3f} ms (default {} {:.3f} ms, {} candidates, {} failed)", ft.family, w.config,
                  ft.winner_ms, ft.default_tile, ft.default_ms, ft.candidates, ft.failures),
      false);
  // Every candidate, fastest first: the side-by-side view (also in the cache's measurements).
  std::vector<const Measurement*> order;
  for (const auto& m : ms) order.push_back(&m);
  std::stable_sort(order.begin(), order.end(), [](const Measurement* a, const Measurement* b) {
    const bool ra = a->status == "ok", rb = b->status == "ok";
    return ra != rb ? ra : ra && a->median_ms < b->median_ms;
  });
  for (const Measurement* m : order)
    say(m->status == "ok" ? fmt::format("      {:<28} {:>9.3f} ms  +-{:.3f}", m->config, m->median_ms, m->spread_ms)
                          : fmt::format("      {:<28} {:>9}     {}", m->config, m->status, m->detail),
        false);
  return true;
}

// ---- step 3b: widening around the winner ----------------------------------------------

// How much slower than the winner the cost model may predict a neighbour and still have it
// timed: the model's median error on measured kernels is about this (bench/fit_cost_model.py).
constexpr double kWidenModelMargin = 0.15;

// Appends up to widen_per_round of the winner's neighbours not yet listed, the model's
// favourites first, leaving out those it predicts slower than the winner by more than its
// margin. Returns false when none is left.
bool add_neighbours(const TuneOptions& o, KernelFamily f, const LayerConfig& layer, int64_t T, Arch arch,
                    const DeviceModel& model, const std::string& winner, std::vector<Candidate>& cs) {
  if (!has_cost_model(f) || o.widen_per_round <= 0) return false;
  const TileConfig best = TileConfig::parse(winner);
  const double best_us = predicted_us(KernelSpec{f, layer, best, arch}, T, model);
  int added = 0;
  for (const RankedTile& r : neighbour_tiles(best, f, layer, T, arch, model)) {
    if (added >= o.widen_per_round || r.predicted_us > best_us * (1 + kWidenModelMargin)) break;
    if (std::any_of(cs.begin(), cs.end(), [&](const Candidate& c) { return c.spec.tile == r.tile; })) continue;
    cs.push_back(Candidate{KernelSpec{f, layer, r.tile, arch}, std::nullopt, "", "", {}});
    ++added;
  }
  return added > 0;
}

// ---- step 4, per token count: the whole step, default against tuned ------------------

void time_step(TokenRun& run, const LayerConfig& layer, const DeviceInfo& dev, KernelCache& cache, int64_t T,
               int samples, TuneReport& rep, const Say& say) {
  LoadOptions tl;
  tl.tokens = T;
  tl.policy = rep.policy;
  auto tuned = std::make_shared<KernelSet>(load_kernels(layer, dev, &cache, tl));
  const MoeLayer tuned_layer(tuned);
  CUstream st = run.ws.stream.get();
  std::vector<double> sd, stn;
  Event e0, e1;
  for (int s = 0; s < samples; ++s)
    for (int which = 0; which < 2; ++which) {
      e0.record(st);
      run.pass(which ? tuned_layer : *run.base_layer, true, true, nullptr, run.next_rotation());
      e1.record(st);
      e1.synchronize();
      (which ? stn : sd).push_back(Event::elapsed_ms(e0, e1));
    }
  rep.step_default_ms = stats_of(sd).median;
  rep.step_tuned_ms = stats_of(stn).median;
  say(fmt::format("step (fwd+bwd) T={}: default {:.3f} ms, tuned {:.3f} ms", T, rep.step_default_ms,
                  rep.step_tuned_ms),
      false);
}

// Forward families first, then backward families (each backward on a fresh default forward).
std::vector<KernelFamily> timing_order(const Candidates& cands) {
  std::vector<KernelFamily> order;
  for (const auto& [f, v] : cands)
    if (is_forward_family(f)) order.push_back(f);
  for (const auto& [f, v] : cands)
    if (!is_forward_family(f)) order.push_back(f);
  return order;
}

}  // namespace

std::string TuneReport::shortfall() const {
  std::string out;
  if (compile_failures > 0) {
    out = fmt::format("{} of {} candidates failed to compile (first: {})", compile_failures, candidates,
                      fmt::join(compile_errors, " | "));
  }
  if (not_stored > 0 || !cache_error.empty()) {
    if (!out.empty()) out += "; ";
    out += fmt::format("{} compiled candidates were not stored: the cache failed ({})", not_stored,
                       cache_error.empty() ? "no reason given" : cache_error);
  }
  return out;
}

TuneReport tune_layer(const TuneOptions& o, KernelCache& cache) {
  const auto t_start = Clock::now();
  const Say say = [&](const std::string& s, bool transient) {
    if (o.progress) o.progress(s, transient);
  };
  if (o.tokens.empty()) throw InvalidArgument("tokens", "give at least one token count to tune for");
  if (o.samples < 10) throw InvalidArgument("samples", "the median needs at least 10 samples");
  const LayerConfig layer = timing_layer(o.layer, o.routing);
  layer.validate();
  require_tunable(layer, o.families, "families");  // before a GPU context or a compile
  TuneReport rep;
  rep.layer = layer.describe();
  rep.policy = measurement_policy(o.routing);

  std::string why;
  const bool gpu = gpu_available(&why);
  std::unique_ptr<DeviceContext> ctx;
  Arch arch = Arch::sm_90a;
  if (gpu) {
    ctx = std::make_unique<DeviceContext>(0);
    arch = ctx->info().arch();
    rep.device = device_fingerprint(ctx->info());
  }

  const size_t family_count = families_to_tune(o, layer).size();
  const DeviceModel model = gpu ? device_model_for(ctx->info().name, ctx->info().sm_count) : DeviceModel{};
  std::vector<Candidate> flat = list_candidates(o, layer, arch, model);
  say(fmt::format("compiling {} candidates of {} families for {} ({})", flat.size(), family_count,
                  rep.layer, to_string(arch)),
      false);
  const auto t_compile = Clock::now();
  build_candidates(flat, cache, rep, say);
  replace_unrunnable(o, layer, arch, model, flat, cache, rep, say);
  if (!rep.cache_error.empty())
    say(fmt::format("the cache failed while storing candidates ({} compiled, not stored): {}", rep.not_stored,
                    rep.cache_error),
        false);
  Candidates cands;
  for (auto& c : flat) cands[c.spec.family].push_back(std::move(c));
  say(fmt::format("compiled {} (cache had {}), {} failed, {} cannot run here, in {:.0f} s", rep.compiled,
                  rep.from_cache, rep.compile_failures, rep.cannot_run, seconds_since(t_compile)),
      false);
  if (!gpu) {
    rep.timed = false;
    rep.why_not_timed = "timing needs a GPU (" + why + ")";
    rep.seconds = seconds_since(t_start);
    return rep;
  }
  rep.timed = true;
  const DeviceInfo& dev = ctx->info();
  // The budget is for timing: compiling the candidates (minutes for the kernel layer's on a few
  // cores) must not use it up before the first family is measured.
  const auto t_timing = Clock::now();

  for (int64_t T : o.tokens) {
    const int64_t bucket = token_bucket(T);
    say(fmt::format("tuning T={} (bucket {})", T, bucket), false);
    TokenRun run(o, layer, T, dev, cache, cands);
    run.warm_up_and_record_reference(o.warmup_ms);
    for (KernelFamily f : timing_order(cands)) {
      std::vector<Candidate>& cs = cands[f];
      FamilyTuning ft;
      ft.family = to_string(f);
      ft.token_bucket = bucket;
      ft.default_tile = cs.front().spec.tile.to_string();
      ft.candidates = static_cast<int>(cs.size());
      if (seconds_since(t_timing) > o.budget_s) {
        ft.note = "budget exhausted: default kept";
        rep.families.push_back(ft);
        continue;
      }
      std::vector<std::unique_ptr<MoeLayer>> layers;
      const TuningKey key = tuning_key(f, layer, bucket, rep.device, rep.policy);
      load_and_check(run, f, key, cs, cache, say, layers);
      time_candidates(run, f, key, cs, layers, o.samples, cache, say);
      bool picked = record_and_pick(key, cs, layers, cache, ft, say);
      // Widening: the winner's neighbours in the kernel layer's space, while the budget lasts.
      for (int round = 0; picked && round < o.widen_rounds && seconds_since(t_timing) <= o.budget_s; ++round) {
        const size_t first = cs.size();
        if (!add_neighbours(o, f, layer, T, arch, model, ft.winner, cs)) break;
        say(fmt::format("  {:<14} widening round {}: {} neighbours of {}", ft.family, round + 1, cs.size() - first,
                        ft.winner),
            false);
        std::vector<Candidate> fresh(std::make_move_iterator(cs.begin() + first), std::make_move_iterator(cs.end()));
        cs.resize(first);
        build_candidates(fresh, cache, rep, say);
        for (auto& c : fresh) cs.push_back(std::move(c));
        ft.widened += static_cast<int>(cs.size() - first);
        const std::string before = ft.winner;
        load_and_check(run, f, key, cs, cache, say, layers, first);
        time_candidates(run, f, key, cs, layers, o.samples, cache, say);
        picked = record_and_pick(key, cs, layers, cache, ft, say);
        if (ft.winner == before) break;  // the neighbours did not win: the model has no better lead
      }
      rep.families.push_back(ft);
    }
    time_step(run, layer, dev, cache, T, o.samples, rep, say);
  }
  rep.seconds = seconds_since(t_start);
  return rep;
}

}  // namespace moeblaze
