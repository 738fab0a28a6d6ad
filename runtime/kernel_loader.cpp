#include "kernel_loader.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "cache_keys.hpp"
#include "generator/heuristics.hpp"

namespace moeblaze {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string to_string(TileSource s) {
  switch (s) {
    case TileSource::tuned_exact: return "tuned (exact key)";
    case TileSource::tuned_same_bucket: return "tuned (same token bucket, other policy)";
    case TileSource::tuned_near_bucket: return "tuned (nearest token bucket within 2x)";
    case TileSource::forced: return "forced";
    case TileSource::default_tile: return "default";
  }
  return "unknown";
}

std::string LoadReport::summary() const {
  int tuned = 0;
  for (const auto& k : kernels) tuned += k.tile_source != TileSource::default_tile;
  std::string s = fmt::format("{} kernels ({} tuned, {} default): {} binaries from the cache, {} compiled; {:.1f} ms "
                              "(compile {:.1f} ms, module load {:.1f} ms)",
                              kernels.size(), tuned, kernels.size() - tuned, cache_hits, compiled, total_ms,
                              compile_ms, module_load_ms);
  for (const auto& w : warnings) s += "; warning: " + w;
  return s;
}

std::optional<std::pair<Winner, TileSource>> pick_winner(const std::vector<Winner>& winners, const TuningKey& exact) {
  const Winner* same_bucket = nullptr;
  const Winner* near = nullptr;
  double near_distance = 2.0;
  for (const Winner& w : winners) {
    if (w.key.family != exact.family || w.key.template_hash != exact.template_hash || w.key.shape != exact.shape ||
        w.key.device != exact.device)
      continue;
    if (w.key.token_bucket == exact.token_bucket) {
      if (w.key.policy == exact.policy) return std::pair{w, TileSource::tuned_exact};
      if (!same_bucket || w.created > same_bucket->created) same_bucket = &w;
      continue;
    }
    if (w.key.token_bucket <= 0 || exact.token_bucket <= 0) continue;
    const double distance = std::abs(std::log2(static_cast<double>(w.key.token_bucket) / exact.token_bucket));
    // Within 2x; on a tie prefer the larger bucket (its tiles assume more rows).
    if (distance <= 1.0 + 1e-9 &&
        (distance < near_distance - 1e-9 ||
         (std::abs(distance - near_distance) < 1e-9 && near && w.key.token_bucket > near->key.token_bucket))) {
      near = &w;
      near_distance = distance;
    }
  }
  if (same_bucket) return std::pair{*same_bucket, TileSource::tuned_same_bucket};
  if (near) return std::pair{*near, TileSource::tuned_near_bucket};
  return std::nullopt;
}

namespace {

void warn_once(LoadReport* report, const std::string& w) {
  if (!report) return;
  for (const auto& seen : report->warnings)
    if (seen == w) return;
  report->warnings.push_back(w);
}

}  // namespace

std::map<KernelFamily, TileConfig> parse_forced_tiles(const std::string& text, const char* name) {
  std::map<KernelFamily, TileConfig> out;
  std::string item;
  auto take = [&] {
    if (item.empty()) return;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw InvalidArgument(name, fmt::format("'{}' is not FAMILY=TILE (e.g. down_proj=128x256x64_w8x1_s4_persist_tmacontig)", item));
    try {
      out[parse_family(item.substr(0, eq))] = TileConfig::parse(item.substr(eq + 1));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(name, fmt::format("'{}': {}", item, e.what()));
    }
    item.clear();
  };
  for (char ch : text) {
    if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\n') take();
    else item += ch;
  }
  take();
  return out;
}

std::vector<BuiltKernel> build_with_cache(const std::vector<KernelSpec>& specs, KernelCache* cache,
                                          LoadReport* report) {
  BuildCounts counts;
  std::vector<BuiltKernel> out = build_all(specs, BuildOptions{cache}, &counts);
  if (report) {
    report->cache_hits += counts.from_cache;
    report->compiled += counts.compiled;
    report->compile_ms += counts.compile_ms;
    // A cache that fails (damaged page, full disk) costs compile time, never the run.
    if (!counts.cache_error.empty())
      warn_once(report, fmt::format("compiling without the cache from here on: {}", counts.cache_error));
  }
  return out;
}

std::vector<KernelSpec> choose_tiles(const LayerConfig& layer, Arch arch, const std::string& fingerprint,
                                     KernelCache* cache, const LoadOptions& o, LoadReport& r) {
  const int64_t bucket = token_bucket(o.tokens > 0 ? o.tokens : 1);
  std::vector<KernelSpec> specs = layer_kernel_specs(layer, arch, o.tokens);
  std::map<std::string, std::vector<Winner>> winners;  // per family, read once
  std::map<KernelFamily, TileConfig> env_force;
  if (const char* v = std::getenv("MOEBLAZE_TILES"); v && *v) env_force = parse_forced_tiles(v, "MOEBLAZE_TILES");
  for (auto& s : specs) {
    KernelChoice c{s.family, s.tile};
    const TileConfig* forced = nullptr;
    if (auto f = o.force.find(s.family); f != o.force.end()) forced = &f->second;
    else if (auto g = env_force.find(s.family); g != env_force.end()) forced = &g->second;
    if (forced) {
      if (const std::string why = legality_problem(KernelSpec{s.family, layer, *forced, arch}); !why.empty())
        throw InvalidArgument("tile", fmt::format("forced {} tile {} for {}: {}", to_string(s.family), forced->to_string(),
                                                  layer.describe(), why));
      s.tile = *forced;
      c.tile_source = TileSource::forced;
    } else if (cache && o.tuned && is_tiled(s.family)) {
      const TuningKey key = tuning_key(s.family, layer, bucket, fingerprint, o.policy);
      auto& list = winners[key.family];
      try {
        if (list.empty())
          for (const std::string& name : family_names(s.family))
            for (Winner w : cache->winners_for(name, key.template_hash, key.shape, key.device)) {
              w.key.family = key.family;  // a row under the family's older name is the family's
              list.push_back(std::move(w));
            }
      } catch (const CacheError& e) {
        warn_once(&r, fmt::format("tuned tiles not read, defaults used: {}", e.what()));
      }
      if (auto w = pick_winner(list, key)) {
        // A winner row can come from an imported or damaged file: one that does not name a
        // tile leaves the default in place, with a warning, and never stops the load.
        std::optional<TileConfig> t;
        try {
          t = TileConfig::parse(w->first.config);
        } catch (const InvalidArgument&) {  // its text is not repeated: it may hold anything
          warn_once(&r, fmt::format("the cache's winner for {} ({}, T~{}) does not name a tile; using the default tile {}",
                                    key.family, layer.describe(), w->first.key.token_bucket, s.tile.to_string()));
        }
        if (t && legality_problem(KernelSpec{s.family, layer, *t, arch}).empty()) {
          s.tile = *t;
          c.tile_source = w->second;
          c.winner_bucket = w->first.key.token_bucket;
        }
      }
    }
    c.tile = s.tile;
    r.kernels.push_back(c);
  }
  tie_following_tiles(specs);
  for (size_t i = 0; i < specs.size(); ++i) r.kernels[i].tile = specs[i].tile;  // a follower's is its leader's
  return specs;
}

KernelSet load_kernels(const LayerConfig& layer, const DeviceInfo& device, KernelCache* cache,
                       const LoadOptions& o, LoadReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadReport local;
  LoadReport& r = report ? *report : local;
  std::vector<KernelSpec> specs = choose_tiles(layer, device.arch(), device_fingerprint(device), cache, o, r);
  std::vector<BuiltKernel> built = build_with_cache(specs, cache, &r);
  for (size_t i = 0; i < built.size(); ++i) r.kernels[i].binary_from_cache = built[i].from_cache;
  KernelSet set = KernelSet::from_kernels(layer, std::move(built));
  const auto t1 = std::chrono::steady_clock::now();
  set.load();
  r.module_load_ms = ms_since(t1);
  r.total_ms = ms_since(t0);
  return set;
}

}  // namespace moeblaze
