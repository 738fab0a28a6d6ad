// Tuner and runtime lookup on the CPU: candidates, the winner fallback chain on recorded
// results, cache-backed building (NVRTC only on a miss), compile-only tuning, baselines.
#include <doctest/doctest.h>

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "cpu/temp_dir.hpp"
#include "core/errors.hpp"
#include "core/hash.hpp"
#include "generator/cost_model.hpp"
#include "generator/heuristics.hpp"
#include "generator/kernel_layer.hpp"
#include "generator/tile_space.hpp"
#include "runtime/cache_keys.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "tuner/candidates.hpp"
#include "tuner/measure.hpp"
#include "tuner/tuner.hpp"

using namespace moeblaze;
namespace fs = std::filesystem;

namespace {

using testing::TempDir;

LayerConfig small_layer() {
  LayerConfig l;
  l.shape = {8, 2, 128, 128};
  return l;
}

Winner winner(const TuningKey& k, const std::string& tile, double created = 1) {
  Winner w;
  w.key = k;
  w.config = tile;
  w.created = created;
  return w;
}

}  // namespace

TEST_CASE("tuner: tile configs print and parse") {
  const TileConfig t{128, 256, 64, 2, 4, 3};
  CHECK(TileConfig::parse(t.to_string()) == t);
  CHECK_THROWS_AS(TileConfig::parse("128x128"), InvalidArgument);
  CHECK_THROWS_AS(TileConfig::parse("128x128x64_w2x4_s4junk"), InvalidArgument);
  CHECK(parse_family("gate_up") == KernelFamily::gate_up);
  CHECK_THROWS_AS(parse_family("up"), InvalidArgument);
}

TEST_CASE("tuner: candidates are legal, unique, default first") {
  const LayerConfig l = find_preset("qwen3-30b-a3b").layer;
  for (KernelFamily f : tunable_families(l)) {
    const auto c = tile_candidates(f, l, Arch::sm_90a, 12);
    REQUIRE(!c.empty());
    CHECK(c.front() == default_tile(f, l, Arch::sm_90a));
    CHECK(c.size() <= 12);
    CHECK(c.size() >= 4);
    std::set<std::string> seen;
    for (const auto& t : c) {
      CHECK(seen.insert(t.to_string()).second);
      CHECK(legality_problem(KernelSpec{f, l, t, Arch::sm_90a}).empty());
    }
  }
  CHECK(tunable_families(l).size() == 9);  // 6 expert GEMMs + 3 router GEMMs
}

TEST_CASE("tuner: the expert GEMMs' candidates are the default, then the kernel layer's space as the cost model ranks it; the router GEMMs' span the tile kinds") {
  const LayerConfig l = find_preset("mixtral-8x7b").layer;
  const int64_t T = find_preset("mixtral-8x7b").tokens;
  for (KernelFamily f : tunable_families(l)) {
    INFO(to_string(f));
    const auto c = tile_candidates(f, l, Arch::sm_90a, TuneOptions{}.candidates_per_family, T);
    REQUIRE(c.size() >= 2);
    CHECK(c.front() == default_tile(f, l, Arch::sm_90a, T));
    if (has_cost_model(f)) {
      // After the default: the ranked space's first picks in its order, one a predicted time
      // (the ties are the widening rounds' to try), none skipped.
      const auto ranked = ranked_tiles(f, l, T, Arch::sm_90a);
      size_t next = 0;
      double last = 0;
      for (size_t i = 1; i < c.size(); ++i) {
        while (next < ranked.size() && (ranked[next].tile == c.front() || ranked[next].predicted_us <= last)) ++next;
        REQUIRE(next < ranked.size());
        CHECK(c[i] == ranked[next].tile);
        CHECK(c[i].cute);
        last = ranked[next].predicted_us;
        ++next;
      }
      continue;
    }
    bool multistage = false, ws = false, persistent = false;
    for (const auto& t : c) {
      multistage |= t.mainloop == Mainloop::wgmma_multistage;
      ws |= t.mainloop == Mainloop::warp_specialized;
      persistent |= t.persistent();
    }
    CHECK(multistage);
    CHECK(ws);
    CHECK_FALSE(persistent);  // the router GEMMs are one tile a block
  }
}

TEST_CASE("tuner: a limit as large as the space is every legal tile of it, the distinct predictions first") {
  // The exhaustive search (`tune --family F --candidates 1000`, bench/heldout.py) must time the
  // tiles the model cannot tell apart too: pairs, orders and depths are where it is blind.
  for (const char* name : {"qwen3-30b-a3b", "mixtral-8x7b"}) {
    const Preset& p = find_preset(name);
    for (KernelFamily f : {KernelFamily::down_proj, KernelFamily::gate_up_wgrad}) {
      INFO(name << " " << to_string(f));
      const auto ranked = ranked_tiles(f, p.layer, p.tokens, Arch::sm_90a);
      const auto all = tile_candidates(f, p.layer, Arch::sm_90a, 100000, p.tokens);
      std::set<std::string> want, got;
      for (const auto& r : ranked) want.insert(r.tile.to_string());
      want.insert(default_tile(f, p.layer, Arch::sm_90a, p.tokens).to_string());
      for (const auto& t : all) CHECK(got.insert(t.to_string()).second);
      CHECK(got == want);
      CHECK(all.size() > 40);
      // The cut keeps its order: the first candidates of the whole list are the 12-candidate list.
      const auto cut = tile_candidates(f, p.layer, Arch::sm_90a, 12, p.tokens);
      REQUIRE(cut.size() <= all.size());
      for (size_t i = 0; i < cut.size(); ++i) CHECK(cut[i] == all[i]);
    }
  }
}

TEST_CASE("tuner: token buckets are powers of two") {
  CHECK(token_bucket(1) == 1);
  CHECK(token_bucket(4096) == 4096);
  CHECK(token_bucket(4097) == 8192);
  CHECK(token_bucket(20000) == 32768);
}

TEST_CASE("tuner: winner lookup falls back exact -> same bucket -> nearest bucket within 2x -> default") {
  const LayerConfig l = small_layer();
  const std::string dev = "GPU|cc9.0|132sm|driver13000", pol = measurement_policy("router");
  const TuningKey exact = tuning_key(KernelFamily::down_proj, l, 8192, dev, pol);

  CHECK(!pick_winner({}, exact).has_value());
  TuningKey other_policy = exact;
  other_policy.policy = measurement_policy("skewed");
  TuningKey half = exact, dbl = exact, quarter = exact, other_dev = exact, other_shape = exact;
  half.token_bucket = 4096;
  dbl.token_bucket = 16384;
  quarter.token_bucket = 2048;
  other_dev.device = "GPU B";
  other_shape.shape = "E=9";

  // Only records that must not apply.
  std::vector<Winner> w = {winner(quarter, "64x64x64_w2x2_s4"), winner(other_dev, "64x128x64_w2x2_s4"),
                           winner(other_shape, "128x64x64_w2x2_s4")};
  CHECK(!pick_winner(w, exact).has_value());
  // Nearest within 2x: both neighbours present, equal distance: the larger bucket wins.
  w.push_back(winner(half, "64x128x64_w2x4_s3"));
  w.push_back(winner(dbl, "256x128x64_w4x2_s3"));
  auto p = pick_winner(w, exact);
  REQUIRE(p.has_value());
  CHECK(p->second == TileSource::tuned_near_bucket);
  CHECK(p->first.key.token_bucket == 16384);
  // Same bucket under another policy beats a neighbouring bucket.
  w.push_back(winner(other_policy, "128x256x64_w2x4_s3"));
  p = pick_winner(w, exact);
  REQUIRE(p.has_value());
  CHECK(p->second == TileSource::tuned_same_bucket);
  CHECK(p->first.config == "128x256x64_w2x4_s3");
  // The exact key wins over everything.
  w.push_back(winner(exact, "128x128x64_w2x4_s5"));
  p = pick_winner(w, exact);
  REQUIRE(p.has_value());
  CHECK(p->second == TileSource::tuned_exact);
  CHECK(p->first.config == "128x128x64_w2x4_s5");
}

TEST_CASE("tuner: binaries come from the cache after the first build; any key change is a miss") {
  TempDir dir;
  KernelCache cache((dir.path / "k.db").string());
  const LayerConfig l = small_layer();
  std::vector<KernelSpec> specs;
  for (const auto& s : layer_kernel_specs(l, Arch::sm_90a))
    if (s.family == KernelFamily::down_proj || s.family == KernelFamily::combine) specs.push_back(s);
  LoadReport first, second;
  const auto a = build_with_cache(specs, &cache, &first);
  CHECK(first.compiled == 2);
  CHECK(first.cache_hits == 0);
  const auto b = build_with_cache(specs, &cache, &second);
  CHECK(second.compiled == 0);
  CHECK(second.cache_hits == 2);
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(b[i].from_cache);
    CHECK(a[i].compiled.cubin == b[i].compiled.cubin);
    CHECK(b[i].compiled.resources.registers == a[i].compiled.resources.registers);
  }
  // Another tile or another shape is another binary.
  specs[0].tile.stages = specs[0].tile.stages == 3 ? 2 : 3;
  LoadReport third;
  build_with_cache({specs[0]}, &cache, &third);
  CHECK(third.compiled == 1);
  const GeneratedKernel g1 = generate(specs[0]);
  KernelSpec s2 = specs[0];
  s2.layer.shape.hidden = 136;
  CHECK(binary_key(g1, CompileOptions{}) != binary_key(generate(s2), CompileOptions{}));
  CHECK(binary_key(g1, CompileOptions{Arch::sm_90a, {}}) != binary_key(g1, CompileOptions{Arch::sm_90a, {"-G"}}));
  // Another architecture or NVRTC version is another key: a binary cached for them is a miss.
  CHECK(binary_key(g1, CompileOptions{Arch::sm_90a, {}}) != binary_key(g1, CompileOptions{parse_arch("sm_80"), {}}));
  const std::string ours = binary_key(g1, CompileOptions{});
  CHECK(ours.find("nvrtc=" + nvrtc_version()) != std::string::npos);
  std::string other_nvrtc = ours.substr(0, ours.find("nvrtc=")) + "nvrtc=12.9";
  CachedBinary foreign = to_cached(a[0], other_nvrtc);
  foreign.key_hash = key_hash(ours);  // even under our hash, the full key decides
  cache.put_binary(foreign);
  CHECK(!cache.find_binary(key_hash(ours), ours).has_value());
}

TEST_CASE("tuner: without a GPU, tune compiles every candidate into the cache and says timing needs a GPU") {
  if (gpu_available()) {
    MESSAGE("a GPU is present: the compile-only path is not taken here");
    return;
  }
  TempDir dir;
  KernelCache cache((dir.path / "k.db").string());
  TuneOptions o;
  o.layer = small_layer();
  o.tokens = {1000};
  o.candidates_per_family = 3;
  const TuneReport r = tune_layer(o, cache);
  CHECK(!r.timed);
  CHECK(r.why_not_timed.find("GPU") != std::string::npos);
  CHECK(r.compile_failures == 0);
  CHECK(r.cannot_run == 0);
  // Three a family, plus the T's default where the cut left it out (the kernel layer's tiles
  // come right after the default).
  CHECK(r.candidates >= 6 * 3);
  CHECK(r.candidates <= 6 * 4);
  CHECK(r.compiled == r.candidates);
  CHECK(cache.summary().binaries == r.candidates);
  const TuneReport again = tune_layer(o, cache);
  CHECK(again.compiled == 0);
  CHECK(again.from_cache == r.candidates);
}

TEST_CASE("tuner: --family tunes the families named and no other; an untiled family is refused by name") {
  TempDir dir;
  KernelCache cache((dir.path / "k.db").string());
  TuneOptions o;
  o.layer = small_layer();
  o.tokens = {1000};
  o.candidates_per_family = 1;
  o.families = {KernelFamily::router_topk};
  CHECK_THROWS_WITH_AS(tune_layer(o, cache), doctest::Contains("router_topk is not a tiled kernel family"),
                       InvalidArgument);
  CHECK(cache.summary().binaries == 0);
  if (gpu_available()) {
    MESSAGE("a GPU is present: the compile-only path is not taken here");
    return;
  }
  o.families = {KernelFamily::down_wgrad};
  const TuneReport r = tune_layer(o, cache);
  CHECK(r.candidates >= 1);
  CHECK(r.candidates <= 2);  // the one candidate, plus the T's default if the cut left it out
  CHECK(r.compiled == r.candidates);
  for (const FamilyTuning& f : r.families) CHECK(f.family == "down_wgrad");
}

TEST_CASE("tuner: a compile-only tune says when candidates failed to compile, and why") {
  if (gpu_available()) {
    MESSAGE("a GPU is present: the compile-only path is not taken here");
    return;
  }
  TempDir dir;
  // A broken toolkit: NVRTC compiles against CUDA_HOME's headers.
  fs::create_directories(dir.path / "cuda" / "include");
  std::ofstream(dir.path / "cuda" / "include" / "cuda_bf16.h") << "#error this toolkit is broken\n";
  // The kernel layer's kernels (_cute tiles: the small layer's down_proj and gate_up_dgrad)
  // reach CCCL's headers through CuTe before cuda_bf16.h.
  fs::create_directories(dir.path / "cuda" / "include" / "cccl" / "cuda" / "std");
  std::ofstream(dir.path / "cuda" / "include" / "cccl" / "cuda" / "std" / "cassert") << "#error this toolkit is broken\n";
  const char* was = std::getenv("CUDA_HOME");
  const std::string saved = was ? was : "";
  ::setenv("CUDA_HOME", (dir.path / "cuda").c_str(), 1);
  KernelCache cache((dir.path / "k.db").string());
  TuneOptions o;
  o.layer = small_layer();
  o.tokens = {1000};
  o.candidates_per_family = 2;
  const TuneReport r = tune_layer(o, cache);
  if (was) ::setenv("CUDA_HOME", saved.c_str(), 1);
  else ::unsetenv("CUDA_HOME");
  CHECK(r.candidates >= 6 * 2);  // two a family, plus the T's default where the cut left it out
  CHECK(r.compile_failures == r.candidates);
  CHECK(r.cannot_run == 0);
  // Distinct first errors only, each the broken header that kernel reached first (cuda_bf16.h;
  // CCCL's cassert for the kernel layer's).
  REQUIRE(r.compile_errors.size() == 2);
  for (const std::string& e : r.compile_errors) CHECK(e.find("this toolkit is broken") != std::string::npos);
  CHECK(r.why_not_timed.find("compiled into the cache") == std::string::npos);
  const std::string why = r.shortfall();
  CHECK(why.find(fmt::format("{0} of {0} candidates failed to compile", r.candidates)) != std::string::npos);
  CHECK(why.find("this toolkit is broken") != std::string::npos);
  CHECK(cache.summary().binaries == 0);
}

TEST_CASE("tuner: a compile-only tune counts the candidates a failing cache did not store") {
  if (gpu_available()) {
    MESSAGE("a GPU is present: the compile-only path is not taken here");
    return;
  }
  TempDir dir;
  const std::string path = (dir.path / "k.db").string();
  { KernelCache fresh(path); }
  // A full disk, in a child: files may not grow past 600 KiB (SIGXFSZ ignored, so a write
  // past it fails with EFBIG), room for a few of the binaries.
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{600 << 10, 600 << 10};
    setrlimit(RLIMIT_FSIZE, &lim);
    std::string out;
    try {
      KernelCache cache(path);
      TuneOptions o;
      o.layer = small_layer();
      o.tokens = {1000};
      o.candidates_per_family = 1;
      const TuneReport r = tune_layer(o, cache);
      out = fmt::format("{} {} {} {}|{}", r.candidates, r.compiled, r.not_stored, r.compile_failures, r.shortfall());
    } catch (const std::exception& e) {
      out = std::string("threw: ") + e.what();
    }
    if (write(fds[1], out.data(), out.size()) < 0) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  INFO(out);
  int candidates = 0, compiled = 0, not_stored = 0, failed = 0;
  REQUIRE(std::sscanf(out.c_str(), "%d %d %d %d|", &candidates, &compiled, &not_stored, &failed) == 4);
  CHECK(candidates >= 6);
  CHECK(compiled == candidates);
  CHECK(failed == 0);
  CHECK(not_stored > 0);
  CHECK(not_stored < candidates);
  CHECK(out.find(fmt::format("{} compiled candidates were not stored: the cache failed (", not_stored)) !=
        std::string::npos);
  KernelCache after(path);
  CHECK(after.summary().binaries == candidates - not_stored);
  CHECK(after.verify(false).integrity_ok);
}

TEST_CASE("tuner: baselines round-trip and regressions are judged beyond the noise") {
  TempDir dir;
  Baseline b;
  b.layer = find_preset("qwen3-30b-a3b").layer;
  b.tokens = 32768;
  b.device = "NVIDIA H200";
  b.kernels = {{"gate_up", "128x128x64_w2x4_s3", 2.0, 0.02}, {"combine", "-", 0.5, 0.01}};
  const std::string path = (dir.path / "b.json").string();
  write_baseline(b, path);
  const Baseline r = read_baseline(path);
  CHECK(r.layer.describe() == b.layer.describe());
  CHECK(r.tokens == b.tokens);
  REQUIRE(r.kernels.size() == 2);
  CHECK(r.kernels[0].tile == "128x128x64_w2x4_s3");
  CHECK(r.kernels[1].median_ms == doctest::Approx(0.5));

  Baseline now = b;
  now.kernels[0].median_ms = 2.15;  // +7.5%: inside 10%
  now.kernels[1].median_ms = 0.6;   // +20%: slower
  auto lines = compare_to_baseline(b, now, 0.10);
  CHECK(!lines[0].slower);
  CHECK(lines[1].slower);
  now.kernels[1].spread_ms = 0.2;  // but very noisy now: within the noise
  lines = compare_to_baseline(b, now, 0.10);
  CHECK(!lines[1].slower);
  now.kernels.pop_back();  // a kernel that disappeared is a failure
  lines = compare_to_baseline(b, now, 0.10);
  CHECK(lines[1].slower);

  CHECK_THROWS_AS(read_baseline((dir.path / "missing.json").string()), InvalidArgument);
  {
    std::ofstream f(dir.path / "bad.json");
    f << "{\"format\": \"something-else\"}";
  }
  CHECK_THROWS_AS(read_baseline((dir.path / "bad.json").string()), InvalidArgument);
}

TEST_CASE("tuner: baseline integers are read at full width, range-checked, and never cast") {
  TempDir dir;
  Baseline b;
  b.layer = find_preset("qwen3-30b-a3b").layer;
  b.tokens = 32768;
  b.kernels = {{"combine", "-", 0.5, 0.01}};
  const std::string good = (dir.path / "good.json").string();
  write_baseline(b, good);
  std::string text;
  {
    std::ifstream f(good);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto with = [&](const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    std::string t = text;
    t.replace(at, from.size(), to);
    const std::string path = (dir.path / "edited.json").string();
    std::ofstream(path) << t;
    return path;
  };
  auto refusal = [&](const std::string& from, const std::string& to) -> std::string {
    try {
      read_baseline(with(from, to));
    } catch (const InvalidArgument& e) {
      CHECK(e.argument == "--baseline");
      return e.reason;
    }
    return "read without an error";
  };
  // 2^32 + 128 once read as E = 128; 2^64 - 1 fits no signed integer.
  CHECK(refusal("\"E\": 128", "\"E\": 4294967424") == "E = 4294967424 is outside [1, 512]");
  CHECK(refusal("\"E\": 128", "\"E\": 18446744073709551615") == "E = 18446744073709551615 is outside [1, 512]");
  CHECK(refusal("\"E\": 128", "\"E\": -128") == "E = -128 is outside [1, 512]");
  CHECK(refusal("\"E\": 128", "\"E\": 128.5") == "E = 128.5 is not an integer");
  CHECK(refusal("\"K\": 8", "\"K\": 4294967304") == "K = 4294967304 is outside [1, 16]");
  CHECK(refusal("\"d\": 2048", "\"d\": 4294969344") == "d = 4294969344 is outside [8, 65536]");
  CHECK(refusal("\"tokens\": 32768", "\"tokens\": 32768.0") == "tokens = 32768.0 is not an integer");
  CHECK(refusal("\"tokens\": 32768", "\"tokens\": 9223372036854775808") ==
        "tokens = 9223372036854775808 is outside [1, 9223372036854775807]");
  CHECK(refusal("\"route_scale\": 1.0", "\"route_scale\": 1e300").find("route_scale") != std::string::npos);
  CHECK(read_baseline(with("\"E\": 128", "\"E\": 128")).layer.shape.experts == 128);
}

TEST_CASE("tuner: the runtime's hash is standard FNV-1a 64 and agrees with the cache keys") {
  CHECK(fnv1a64("") == 14695981039346656037ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);  // published FNV-1a test vector
  CHECK(key_hash("a") == "af63dc4c8601ec8c");
}

TEST_CASE("tuner: 192-column tiles where the output is a multiple of 192 but not of 256") {
  const LayerConfig gpt = find_preset("gpt-oss-20b").layer;  // d = n = 2880
  // The all-TMA GEMMs default to the kernel layer's 192-wide tiles (down_proj ping-pong,
  // gate_up_dgrad cooperative).
  for (KernelFamily f : {KernelFamily::down_proj, KernelFamily::gate_up_dgrad}) {
    INFO(to_string(f));
    CHECK(fits_192_better(f, gpt));
    const TileConfig def = default_tile(f, gpt, Arch::sm_90a);
    CHECK(def.bn == 192);
    CHECK(def.cute);
    CHECK(def.pingpong() == (f == KernelFamily::down_proj));
    const auto c = tile_candidates(f, gpt, Arch::sm_90a, 12, 16384);
    for (const auto& t : c) CHECK_MESSAGE(legality_problem(KernelSpec{f, gpt, t, Arch::sm_90a}).empty(), t.to_string());
    // The space holds the 192-wide tiles of both schedules.
    int narrow = 0;
    for (const auto& r : ranked_tiles(f, gpt, 16384, Arch::sm_90a)) narrow += r.tile.bn == 192;
    CHECK(narrow >= 2);
  }
  // The weight gradients' gathered MN-major stages take no 192-wide tiles.
  for (const auto& t : tile_candidates(KernelFamily::down_wgrad, gpt, Arch::sm_90a, 8, 16384)) CHECK(t.bn != 192);
}

TEST_CASE("tuner: down_proj's ping-pong and gate_up's 160-wide defaults are for layers with n <= d (wider h keeps the earlier tiles)") {
  // Where d fills 256-wide tiles, the kernel layer's cooperative tile, h wider than d or not
  // (mixtral-8x7b's 14336 > 4096 measured); else the 128x192 ping-pong tile where n <= d.
  LayerConfig narrow_h = find_preset("gpt-oss-20b").layer;  // n 2880 <= d 2880
  CHECK(default_tile(KernelFamily::down_proj, narrow_h, Arch::sm_90a).pingpong());
  LayerConfig wide_h = narrow_h;
  wide_h.shape.hidden = 1984;  // n 2880 > d: a forward that may run in slot chunks
  CHECK(default_tile(KernelFamily::down_proj, wide_h, Arch::sm_90a).to_string() ==
        "128x256x64_w8x1_s4_persist_tmacontig_tmastore64");
  LayerConfig cute_wide_h = find_preset("qwen3-30b-a3b").layer;
  cute_wide_h.shape.hidden = 512;
  CHECK(default_tile(KernelFamily::down_proj, cute_wide_h, Arch::sm_90a).to_string() ==
        "128x256x64_w8x1_s3_persist_tmacontig_tmastore_cute");
  // gate_up: the kernel layer's 2 x 96 tile, h wider than d or not (mixtral-8x7b measured, the
  // chunked small shapes grad-checked); a plain activation (hand-written) keeps the 128-wide
  // tile where h is wider than d, not the 160-wide one.
  LayerConfig gpt_wide_h = find_preset("gpt-oss-20b").layer;  // n 2880 = 18 x 160
  gpt_wide_h.shape.hidden = 2048;
  CHECK(default_tile(KernelFamily::gate_up, gpt_wide_h, Arch::sm_90a).to_string() ==
        "128x96x64_w4x1_s4_pingpong_tmacontig_tmastore_cute");
  gpt_wide_h.activation = Activation::gelu;
  CHECK(default_tile(KernelFamily::gate_up, gpt_wide_h, Arch::sm_90a).bn == 128);
  gpt_wide_h.shape.hidden = 2880;
  CHECK(default_tile(KernelFamily::gate_up, gpt_wide_h, Arch::sm_90a).bn == 96);  // plain, n <= d: hand-written 96
}

TEST_CASE("tuner: gate_up is the kernel layer's 128 x (2 x 96) ping-pong tile on every suite shape, a pair where experts are wide and their slots many; the hand-written rules (2 x 96 where n is a multiple of 96, 2 x 160 where of 160 but not 128)") {
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    INFO(p.name);
    const int n = p.layer.shape.ffn;
    const bool within_d = n <= p.layer.shape.hidden;
    const bool pingpong96 = n % 96 == 0 && within_d;
    CHECK(pingpong96 == (p.name == "qwen3-30b-a3b" || p.name == "gpt-oss-20b"));  // 768 = 8 x 96, 2880 = 30 x 96
    const bool fill160 = !pingpong96 && n % 128 != 0 && n % 160 == 0 && within_d;
    CHECK_FALSE(fill160);  // gpt-oss-20b's 2880 = 18 x 160 takes the ping-pong tile first
    // The kernel layer's 128 x (2 x 96) tile, where the weights stream (deepseek-v3) too, and n a
    // multiple of 96 or not (the TMA stores clip the last column of tiles); a cluster pair
    // multicasting W1 | W3 where an expert's weights are wide and its slots many (mixtral-8x7b).
    const TileConfig up = default_tile(KernelFamily::gate_up, p.layer, Arch::sm_90a, p.tokens);
    const bool pair = wide_experts(p.layer) && !weights_stream(p.layer, p.tokens);
    CHECK(pair == (p.name == "mixtral-8x7b"));
    CHECK(up.to_string() == (pair ? "128x96x64_w4x1_s4_pingpong_tmacontig_tmastore_cluster2x1_cute"
                                   : "128x96x64_w4x1_s4_pingpong_tmacontig_tmastore_cute"));
    CHECK(legality_problem(KernelSpec{KernelFamily::gate_up, p.layer, up, Arch::sm_90a}).empty());
    if (p.name == "mixtral-8x7b")  // 1024 slots an expert at T = 4096: its weights stream, no pair
      CHECK(default_tile(KernelFamily::gate_up, p.layer, Arch::sm_90a, 4096).cluster_m == 1);
  }
}

TEST_CASE("tuner: the TMA-store families default to the kernel layer or _tmastore64, the few-slot weight gradients to _tmastore") {
  const char* const presets[] = {"mixtral-8x7b", "gpt-oss-20b", "olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v3", "qwen3-next-80b"};
  for (const char* p : presets) {
    const LayerConfig l = find_preset(p).layer;
    for (KernelFamily f : {KernelFamily::gate_up_wgrad, KernelFamily::down_wgrad}) {
      INFO(p << " " << to_string(f));
      // E / K >= 8 (T unknown): few slots per expert, the whole-tile staging and its fp32 TMA path;
      // mixtral-8x7b (E / K = 4): _tmastore64. Both with the producer's direct arrivals.
      // down_wgrad: the kernel layer's cooperative 128x256 tile where d (and n) fill 256-wide
      // tiles (all but gpt-oss-20b's 2880).
      // gate_up_wgrad on few slots where d fills 256-wide tiles: the kernel layer's 4-stage tile.
      const bool few = std::string(p) != "mixtral-8x7b";
      const bool d256 = std::string(p) != "gpt-oss-20b";
      const bool cute = f == KernelFamily::down_wgrad && d256;
      const bool cute4 = f == KernelFamily::gate_up_wgrad && few && d256;
      CHECK(default_tile(f, l, Arch::sm_90a).to_string() ==
            (cute    ? "128x256x64_w8x1_s3_persist_tmacontig_tmastore_cute"
             : cute4 ? "128x256x64_w8x1_s4_persist_tmacontig_tmastore_cute"
             : few ? "128x256x64_w8x1_s3_persist_tmacontig_tmastore_directarrive"
                   : "128x256x64_w8x1_s4_persist_tmacontig_tmastore64_directarrive"));
    }
    for (KernelFamily f : {KernelFamily::down_proj, KernelFamily::gate_up_dgrad}) {
      INFO(p << " " << to_string(f));
      // The kernel layer's cooperative 128x256 tile where d fills 256-column tiles (gate_up_dgrad:
      // and its reduction G n is at most 64 k-steps, not mixtral-8x7b's 28672); where 192 fills d
      // and 256 does not (gpt-oss-20b's 2880), the layer's 128x192 tiles (down_proj ping-pong,
      // gate_up_dgrad cooperative); else the hand-written cooperative 128x256.
      const std::string name = p;
      const bool fills_192 = name == "gpt-oss-20b";
      const bool cute = !fills_192 && (f == KernelFamily::down_proj || name != "mixtral-8x7b");
      CHECK(default_tile(f, l, Arch::sm_90a).to_string() ==
            (cute        ? "128x256x64_w8x1_s3_persist_tmacontig_tmastore_cute"
             : fills_192 ? (f == KernelFamily::down_proj ? "128x192x64_w4x1_s4_pingpong_tmacontig_tmastore_cute"
                                                         : "128x192x64_w8x1_s4_persist_tmacontig_tmastore_cute")
                         : "128x256x64_w8x1_s4_persist_tmacontig_tmastore64"));
    }
    // gate_up: the kernel layer's ping-pong tile (its gathered copies always arrive on the full
    // barrier); the hand-written cluster pair where the weights stream polls, and its single
    // block is a candidate
    INFO(p);
    TileConfig up = default_tile(KernelFamily::gate_up, l, Arch::sm_90a);
    if (up.cute) {
      CHECK(up.pingpong());
      CHECK_FALSE(up.direct_arrive);
    } else {
      CHECK(up.cluster_m == 2);
      CHECK_FALSE(up.direct_arrive);
    }
  }
  // Where the layer cannot take TMA stores, the 4-stage register-store tiles: down_proj with expert
  // biases, and weight gradients whose output rows are not 16-byte aligned.
  LayerConfig biased = find_preset("gpt-oss-20b").layer;
  biased.expert_bias = true;
  CHECK_FALSE(default_tile(KernelFamily::down_proj, biased, Arch::sm_90a).tma_store);
  // (gate_up_dgrad takes no bias: the kernel layer's tile, as without biases)
  CHECK(default_tile(KernelFamily::gate_up_dgrad, biased, Arch::sm_90a) ==
        default_tile(KernelFamily::gate_up_dgrad, find_preset("gpt-oss-20b").layer, Arch::sm_90a));
  LayerConfig odd = find_preset("qwen3-30b-a3b").layer;
  odd.shape.hidden = 2052;  // d % 8 = 4: dW1 / dW3 rows of 2052 elements
  for (int64_t T : {int64_t{0}, int64_t{4096}, int64_t{65536}}) {
    const TileConfig w = default_tile(KernelFamily::gate_up_wgrad, odd, Arch::sm_90a, T);
    CHECK_FALSE(w.tma_store);
    CHECK(legality_problem(KernelSpec{KernelFamily::gate_up_wgrad, odd, w, Arch::sm_90a}).empty());
  }
}

TEST_CASE("tuner: with the step's tokens known, the weight gradients' default follows the slots per expert") {
  const LayerConfig olmoe = find_preset("olmoe-1b-7b").layer;     // E = 64, K = 8
  const LayerConfig mixtral = find_preset("mixtral-8x7b").layer;  // E = 8, K = 2
  CHECK(few_slots_per_expert(olmoe, 16384));    // 2048 slots per expert
  CHECK_FALSE(few_slots_per_expert(olmoe, 16385));
  CHECK_FALSE(few_slots_per_expert(olmoe, 32768));  // its preset's tokens: 4096
  CHECK(few_slots_per_expert(mixtral, 8192));       // 2048
  CHECK_FALSE(few_slots_per_expert(mixtral, 0));    // unknown T: E / K = 4
  CHECK(few_slots_per_expert(olmoe, 0));            // unknown T: E / K = 8
  // weights_stream: an expert's gate/up weights over 40 MiB and at most 1024 slots an expert
  const LayerConfig deepseek = find_preset("deepseek-v3").layer;  // E = 256, K = 8, 56 MiB an expert
  CHECK(weights_stream(deepseek, 32768));                           // 1024 slots per expert
  CHECK_FALSE(weights_stream(deepseek, 32769));
  CHECK(weights_stream(deepseek, 0));                               // unknown T: E / K = 32
  CHECK(weights_stream(mixtral, 4096));                             // 1024 slots, 224 MiB an expert
  CHECK_FALSE(weights_stream(mixtral, 0));                          // unknown T: E / K = 4
  CHECK_FALSE(weights_stream(find_preset("qwen3-next-80b").layer, 0));  // 4 MiB an expert
  // (down_wgrad runs the kernel layer's tile at every T where d and n fill 256-wide tiles)
  for (KernelFamily f : {KernelFamily::gate_up_wgrad, KernelFamily::down_wgrad}) {
    INFO(to_string(f));
    // (gate_up_wgrad: the kernel layer's 4-stage tile on few slots, the hand-written one on many)
    const bool cute = f == KernelFamily::down_wgrad;
    const std::string kernel_layer = "128x256x64_w8x1_s3_persist_tmacontig_tmastore_cute";
    const std::string few = cute ? kernel_layer : "128x256x64_w8x1_s4_persist_tmacontig_tmastore_cute";
    CHECK(default_tile(f, olmoe, Arch::sm_90a, 32768).to_string() ==
          (cute ? kernel_layer : "128x256x64_w8x1_s4_persist_tmacontig_tmastore64_directarrive"));
    CHECK(default_tile(f, olmoe, Arch::sm_90a, 4096).to_string() == few);
    CHECK(default_tile(f, mixtral, Arch::sm_90a, 2048).to_string() == few);
    // the other families do not depend on T
    for (KernelFamily g : {KernelFamily::gate_up, KernelFamily::down_proj, KernelFamily::down_dgrad, KernelFamily::gate_up_dgrad})
      CHECK(default_tile(g, olmoe, Arch::sm_90a, 32768) == default_tile(g, olmoe, Arch::sm_90a));
  }
  // the runtime's specs take the same hint
  for (const auto& s : layer_kernel_specs(olmoe, Arch::sm_90a, 32768))
    if (s.family == KernelFamily::gate_up_wgrad) CHECK(s.tile.tma_store_blocks);
  for (const auto& s : layer_kernel_specs(olmoe, Arch::sm_90a, 4096))
    if (s.family == KernelFamily::gate_up_wgrad) CHECK_FALSE(s.tile.tma_store_blocks);
}

TEST_CASE("tuner: down_dgrad defaults to the persistent 128x256 tile where its reduction (d) is long") {
  // d = 4096, 2880, 7168, 2048, 2048, 2048
  // (deepseek-v3, whose experts' weights stream through L2: the kernel layer's ping-pong tile)
  for (const char* p : {"mixtral-8x7b", "gpt-oss-20b", "deepseek-v3", "qwen3-30b-a3b", "olmoe-1b-7b", "qwen3-next-80b"})
    CHECK_MESSAGE(default_tile(KernelFamily::down_dgrad, find_preset(p).layer, Arch::sm_90a).to_string() ==
                      (std::string(p) == "deepseek-v3" ? "128x128x64_w4x1_s4_pingpong_tmacontig_tmastore_cute"
                                                       : "128x256x64_w8x1_s4_persist_tmacontig_directarrive"),
                  p);
  // a short reduction (d = 1024: 16 k-steps) keeps the two-blocks-per-SM tile
  LayerConfig short_d = find_preset("qwen3-30b-a3b").layer;
  short_d.shape.hidden = 1024;
  CHECK(default_tile(KernelFamily::down_dgrad, short_d, Arch::sm_90a).to_string() == "128x128x64_w8x1_s3_wgmma");
  // d not a multiple of 64 cannot take W2 by TMA: the two-blocks-per-SM tile
  LayerConfig l = find_preset("mixtral-8x7b").layer;
  l.shape.hidden = 4104;
  CHECK(default_tile(KernelFamily::down_dgrad, l, Arch::sm_90a).to_string() == "128x128x64_w8x1_s3_wgmma");
  // gate_grad sums down_dgrad's column tiles: same tile
  const LayerConfig gpt = find_preset("gpt-oss-20b").layer;
  CHECK(default_tile(KernelFamily::gate_grad, gpt, Arch::sm_90a) == default_tile(KernelFamily::down_dgrad, gpt, Arch::sm_90a));
}

TEST_CASE("loader: MOEBLAZE_TILES forces tiles for every layer a process loads, below LoadOptions::force") {
  const LayerConfig layer = find_preset("qwen3-30b-a3b").layer;
  const std::string device = "dev";
  const TileConfig wgmma = wgmma_tile(128, 128, 3);
  auto tile_of = [&](const std::vector<KernelSpec>& specs, KernelFamily f) {
    for (const auto& s : specs)
      if (s.family == f) return s.tile;
    FAIL("family missing");
    return TileConfig{};
  };
  const auto forced = parse_forced_tiles(" down_proj=128x128x64_w8x1_s3_wgmma,gate_up_wgrad=128x128x64_w8x1_s3_wgmma ", "x");
  CHECK(forced.size() == 2);
  CHECK(forced.at(KernelFamily::down_proj) == wgmma);
  for (const char* bad : {"down_proj", "=128x128x64_w8x1_s3_wgmma", "nosuch=128x128x64_w8x1_s3_wgmma", "down_proj=12x"}) {
    INFO(bad);
    try {
      parse_forced_tiles(bad, "MOEBLAZE_TILES");
      FAIL("accepted");
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()).find("MOEBLAZE_TILES") != std::string::npos);
    }
  }
  setenv("MOEBLAZE_TILES", "down_proj=128x128x64_w8x1_s3_wgmma", 1);
  LoadReport r;
  const auto specs = choose_tiles(layer, Arch::sm_90a, device, nullptr, LoadOptions{4096, "p", {}}, r);
  CHECK(tile_of(specs, KernelFamily::down_proj) == wgmma);
  for (const auto& k : r.kernels)
    if (k.family == KernelFamily::down_proj) CHECK(k.tile_source == TileSource::forced);
  // The caller's own force wins over the variable.
  TileConfig other = wgmma_tile(128, 64, 3);
  LoadReport r2;
  const auto mine = choose_tiles(layer, Arch::sm_90a, device, nullptr, LoadOptions{4096, "p", {{KernelFamily::down_proj, other}}}, r2);
  CHECK(tile_of(mine, KernelFamily::down_proj) == other);
  // An illegal forced tile is an error naming the tile, not a silent default.
  setenv("MOEBLAZE_TILES", "gate_up=128x128x64_w4x1_s6_pingpong_tmacontig_tmastore_cute", 1);
  LoadReport r3;
  CHECK_THROWS_AS(choose_tiles(layer, Arch::sm_90a, device, nullptr, LoadOptions{4096, "p", {}}, r3), InvalidArgument);
  setenv("MOEBLAZE_TILES", "bogus", 1);
  LoadReport r4;
  CHECK_THROWS_AS(choose_tiles(layer, Arch::sm_90a, device, nullptr, LoadOptions{4096, "p", {}}, r4), InvalidArgument);
  unsetenv("MOEBLAZE_TILES");
}

TEST_CASE("nvrtc: CUTLASS's headers are found by MOEBLAZE_CUTLASS_INCLUDE and must be the pinned release") {
  const std::string saved = std::getenv("MOEBLAZE_CUTLASS_INCLUDE") ? std::getenv("MOEBLAZE_CUTLASS_INCLUDE") : "";
  const auto dir = std::filesystem::temp_directory_path() / ("mb_cutlass_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "cutlass");
  std::ofstream(dir / "cutlass" / "version.h") << "#define CUTLASS_MAJOR 3\n#define CUTLASS_MINOR 8\n#define CUTLASS_PATCH 0\n";
  setenv("MOEBLAZE_CUTLASS_INCLUDE", dir.c_str(), 1);
  // Another release there: skipped with the reason (the build-time default may still be found).
  try {
    const std::string found = find_cutlass_include_dir();
    CHECK(found != dir.string());
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("CUTLASS 3.8.0, not 4.2.0") != std::string::npos);
  }
  std::ofstream(dir / "cutlass" / "version.h") << "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n";
  CHECK(find_cutlass_include_dir() == dir.string());
  std::filesystem::remove_all(dir);
  if (saved.empty()) unsetenv("MOEBLAZE_CUTLASS_INCLUDE");
  else setenv("MOEBLAZE_CUTLASS_INCLUDE", saved.c_str(), 1);
}

TEST_CASE("tile space: every ranked point is legal, refusals have reasons, the ranking is ordered and the same on every call") {
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    for (KernelFamily f : {KernelFamily::gate_up, KernelFamily::down_proj, KernelFamily::down_dgrad,
                           KernelFamily::down_wgrad, KernelFamily::gate_up_wgrad, KernelFamily::gate_up_dgrad}) {
      INFO(p.name << " " << to_string(f));
      const auto space = kernel_layer_space(f, p.layer, Arch::sm_90a);
      REQUIRE(space.size() > 100);
      size_t legal = 0;
      for (const SpacePoint& pt : space) {
        CHECK(pt.refused == legality_problem(KernelSpec{f, p.layer, pt.tile, Arch::sm_90a}));
        CHECK(pt.tile.cute);
        legal += pt.refused.empty();
      }
      const auto ranked = ranked_tiles(f, p.layer, p.tokens, Arch::sm_90a);
      CHECK(ranked.size() == legal);
      for (size_t i = 0; i < ranked.size(); ++i) {
        CHECK(ranked[i].predicted_us > 0);
        if (i) CHECK(ranked[i - 1].predicted_us <= ranked[i].predicted_us);
      }
      const auto again = ranked_tiles(f, p.layer, p.tokens, Arch::sm_90a);
      REQUIRE(again.size() == ranked.size());
      for (size_t i = 0; i < ranked.size(); ++i) CHECK(again[i].tile == ranked[i].tile);
      // every suite shape has kernel-layer tiles for each family (gpt-oss-20b's down_wgrad only
      // 64 wide: its n = 2880 is no multiple of 128, and the ragged hg loads take whole column
      // tiles only)
      REQUIRE(legal > 0);
      if (p.name == "gpt-oss-20b" && f == KernelFamily::down_wgrad)
        for (const RankedTile& r : ranked) CHECK(r.tile.bn == 64);
      // The first pick's neighbours: legal, not the pick, one dimension away (a schedule change
      // may come with another depth).
      const TileConfig& top = ranked.front().tile;
      for (const RankedTile& n : neighbour_tiles(top, f, p.layer, p.tokens, Arch::sm_90a)) {
        CHECK_FALSE(n.tile == top);
        CHECK(legality_problem(KernelSpec{f, p.layer, n.tile, Arch::sm_90a}).empty());
        const int changed = (n.tile.bm != top.bm) + (n.tile.bn != top.bn) + (n.tile.pingpong() != top.pingpong()) +
                            (n.tile.cluster_m != top.cluster_m) + (n.tile.alt_order != top.alt_order) +
                            (n.tile.stages != top.stages && n.tile.pingpong() == top.pingpong());
        CHECK_MESSAGE(changed == 1, n.tile.to_string() << " from " << top.to_string());
      }
    }
  }
  // Off the kernel layer (sm_86, the router GEMMs) the space is empty.
  CHECK(kernel_layer_space(KernelFamily::gate_up, find_preset("qwen3-30b-a3b").layer, parse_arch("sm_86")).empty());
  CHECK(kernel_layer_space(KernelFamily::router_logits, find_preset("qwen3-30b-a3b").layer, Arch::sm_90a).empty());
}

TEST_CASE("cost model: waves and tail, k-steps, pairs and the device's bandwidth move the terms as they should") {
  const LayerConfig l = find_preset("qwen3-30b-a3b").layer;  // E 128, K 8, d 2048, n 768
  const int64_t T = 32768;                                    // 2048 slots an expert
  const DeviceModel h100 = device_model_for("NVIDIA H100 80GB HBM3", 132);
  const DeviceModel h200 = device_model_for("NVIDIA H200", 132);
  CHECK(h200.dram_gb_s > h100.dram_gb_s);
  const TileConfig t = kernel_layer_tile(128, 256, 3, Mainloop::persistent);
  const CostTerms c = cost_terms(KernelSpec{KernelFamily::down_proj, l, t, Arch::sm_90a}, T, h100);
  // 2048 / 128 = 16 M tiles x 2048 / 256 = 8 N tiles x 128 experts, over 132 SMs; n / 64 k-steps.
  CHECK(c.tiles_total == 16 * 8 * 128);
  CHECK(c.tiles == doctest::Approx(std::ceil(16.0 * 8 * 128 / 132)));
  CHECK(c.k_steps == 768 / 64);
  CHECK(c.tile_class == 1);
  CHECK(cost_terms(KernelSpec{KernelFamily::down_proj, l, t, Arch::sm_90a}, T, h200).dram_us < c.dram_us);
  // Twice the tokens: twice the tiles, the same k-steps; the weight gradients reduce over slots.
  const CostTerms c2 = cost_terms(KernelSpec{KernelFamily::down_proj, l, t, Arch::sm_90a}, 2 * T, h100);
  CHECK(c2.tiles_total == 2 * c.tiles_total);
  const CostTerms w = cost_terms(KernelSpec{KernelFamily::down_wgrad, l, t, Arch::sm_90a}, T, h100);
  const CostTerms w2 = cost_terms(KernelSpec{KernelFamily::down_wgrad, l, t, Arch::sm_90a}, 2 * T, h100);
  CHECK(w2.k_steps == 2 * w.k_steps);
  CHECK(w2.tiles_total == w.tiles_total);
  // One stage can't cover the load latency: a 2-stage k-step is no shorter than a 4-stage one.
  const CostTerms s2 = cost_terms(KernelSpec{KernelFamily::down_proj, l, kernel_layer_tile(128, 128, 2, Mainloop::pingpong), Arch::sm_90a}, T, h100);
  const CostTerms s4 = cost_terms(KernelSpec{KernelFamily::down_proj, l, kernel_layer_tile(128, 128, 4, Mainloop::pingpong), Arch::sm_90a}, T, h100);
  CHECK(s2.step_us >= s4.step_us);
  CHECK(s2.tile_class == 0);
  // A pair multicasts B: its k-step loads less than the single block's.
  const CostTerms pair = cost_terms(KernelSpec{KernelFamily::down_proj, l, kernel_layer_tile(128, 128, 4, Mainloop::pingpong, 2), Arch::sm_90a}, T, h100);
  CHECK(pair.step_us <= s4.step_us);
  // Hand-written tiles are class 2; the router GEMMs have no model.
  CHECK(cost_terms(KernelSpec{KernelFamily::down_proj, l, wgmma_tile(128, 256, 4, Mainloop::persistent), Arch::sm_90a}, T, h100).tile_class == 2);
  CHECK_THROWS_AS(cost_terms(KernelSpec{KernelFamily::router_logits, l, t, Arch::sm_90a}, T, h100), InvalidArgument);
  CHECK_THROWS_AS(cost_terms(KernelSpec{KernelFamily::down_proj, l, t, Arch::sm_90a}, 0, h100), InvalidArgument);
}

TEST_CASE("tuner: where the kernel layer has no legal tile for a family (expert biases), the candidates are the listed tiles, not the default alone") {
  LayerConfig biased = find_preset("gpt-oss-20b").layer;
  biased.expert_bias = true;
  for (KernelFamily f : {KernelFamily::gate_up, KernelFamily::down_proj}) {
    INFO(to_string(f));
    REQUIRE(ranked_tiles(f, biased, 16384, Arch::sm_90a).empty());
    const auto c = tile_candidates(f, biased, Arch::sm_90a, 8, 16384);
    CHECK(c.size() >= 4);
    CHECK(c.front() == default_tile(f, biased, Arch::sm_90a, 16384));
    for (const auto& t : c) {
      CHECK_FALSE(t.cute);
      CHECK(legality_problem(KernelSpec{f, biased, t, Arch::sm_90a}).empty());
    }
  }
}

TEST_CASE("tuner: the driver errors after which a context runs nothing more are told from the others") {
  // A candidate that faults stops the tune naming it (stop_on_fault); any other failure is the
  // candidate's own and the tune goes on.
  for (CUresult r : {CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_INSTRUCTION, CUDA_ERROR_MISALIGNED_ADDRESS,
                     CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_HARDWARE_STACK_ERROR, CUDA_ERROR_INVALID_PC,
                     CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_LAUNCH_TIMEOUT})
    CHECK(is_context_fatal(static_cast<int>(r)));
  for (CUresult r : {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                     CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_NOT_FOUND})
    CHECK_FALSE(is_context_fatal(static_cast<int>(r)));
}

TEST_CASE("tuner: a candidate that cannot run is replaced by the next tile of its family's ranked list") {
  // phi-3.5-moe's cooperative gate_up tiles spill (ptxas, CUDA 13.0) where qwen3-30b-a3b's do
  // not: the tuner compiles the next ranked tiles in their place (replace_unrunnable).
  const LayerConfig l = find_preset("qwen3-30b-a3b").layer;
  for (KernelFamily f : {KernelFamily::gate_up, KernelFamily::down_dgrad}) {
    INFO(to_string(f));
    const auto listed = tile_candidates(f, l, Arch::sm_90a, 12, 4096);
    const auto longer = tile_candidates(f, l, Arch::sm_90a, 15, 4096);
    REQUIRE(longer.size() == 15);
    const auto more = replacement_tiles(listed, 3, longer);
    REQUIRE(more.size() == 3);
    for (size_t i = 0; i < 3; ++i) CHECK(more[i] == longer[12 + i]);  // the next ones, in rank order
    CHECK(replacement_tiles(listed, 0, longer).empty());
    // A list with a per-T default appended past the cut: that tile is not offered again.
    std::vector<TileConfig> with_extra = listed;
    with_extra.push_back(longer[13]);
    const auto skip = replacement_tiles(with_extra, 2, longer);
    REQUIRE(skip.size() == 2);
    CHECK(skip[0] == longer[12]);
    CHECK(skip[1] == longer[14]);
  }
}
