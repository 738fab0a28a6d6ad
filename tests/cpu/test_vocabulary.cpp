// The names of docs/design.md's glossary, no GPU: tile, family and target names round-trip;
// the older spellings still read as the same configurations and families, so cache rows,
// regress baselines and command lines that hold them keep working; the host's and the
// templates' names of a mainloop agree.
#include <doctest/doctest.h>

#include <string>
#include <utility>

#include <fmt/format.h>

#include "cache_test_util.hpp"
#include "core/errors.hpp"
#include "generator/heuristics.hpp"
#include "generator/kernel_spec.hpp"
#include "runtime/cache_keys.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "tuner/measure.hpp"

using namespace moeblaze;

namespace {

TileConfig tile(int bm, int bn, int stages, Mainloop m, bool tma = false, bool store = false, bool alt = false,
                int cluster = 1) {
  TileConfig t = wgmma_tile(bm, bn, stages, m);
  t.tma_contiguous = tma;
  t.tma_store = store;
  t.alt_order = alt;
  t.cluster_m = cluster;
  return t;
}

}  // namespace

TEST_CASE("vocabulary: every tile kind writes its name and reads it back") {
  const std::pair<TileConfig, const char*> names[] = {
      {TileConfig{}, "128x128x64_w2x4_s3"},
      {wgmma_tile(128, 128, 3), "128x128x64_w8x1_s3_wgmma"},
      {tile(128, 256, 4, Mainloop::warp_specialized, true), "128x256x64_w8x1_s4_ws_tmacontig"},
      {tile(128, 256, 3, Mainloop::persistent, true, true), "128x256x64_w8x1_s3_persist_tmacontig_tmastore"},
      {tile(128, 128, 6, Mainloop::pingpong, true), "128x128x64_w4x1_s6_pingpong_tmacontig"},
      {[] {
         TileConfig t = tile(128, 256, 4, Mainloop::persistent, true, true);
         t.tma_store_blocks = true;
         return t;
       }(),
       "128x256x64_w8x1_s4_persist_tmacontig_tmastore64"},
      {[] {
         TileConfig t = tile(128, 256, 3, Mainloop::persistent, true, true, true);
         t.direct_arrive = true;
         return t;
       }(),
       "128x256x64_w8x1_s3_persist_tmacontig_tmastore_altorder_directarrive"},
      {tile(128, 256, 4, Mainloop::persistent, true, false, true), "128x256x64_w8x1_s4_persist_tmacontig_altorder"},
      {tile(128, 256, 4, Mainloop::persistent, true, false, false, 2), "128x256x64_w8x1_s4_persist_tmacontig_cluster2x1"},
      {tile(64, 256, 5, Mainloop::pingpong, true, false, true, 2),
       "64x256x64_w4x1_s5_pingpong_tmacontig_altorder_cluster2x1"},
      {[] {
         TileConfig t = tile(128, 128, 6, Mainloop::pingpong, true, true, false, 2);
         t.cute = true;
         return t;
       }(),
       "128x128x64_w4x1_s6_pingpong_tmacontig_tmastore_cluster2x1_cute"},
  };
  for (const auto& [t, name] : names) {
    INFO(name);
    CHECK(t.to_string() == name);
    CHECK(TileConfig::parse(name) == t);
  }
}

TEST_CASE("vocabulary: the older tile suffixes read as the same configurations") {
  // Older spelling -> today's: _wg, _wsp, _pp, _tma, _tstore, _swap, _c2, as cache rows, regress
  // baselines and command lines may still hold them.
  const std::pair<const char*, const char*> renamed[] = {
      {"128x128x64_w8x1_s3_wg", "128x128x64_w8x1_s3_wgmma"},
      {"128x256x64_w8x1_s4_ws", "128x256x64_w8x1_s4_ws"},
      {"128x256x64_w8x1_s4_ws_tma", "128x256x64_w8x1_s4_ws_tmacontig"},
      {"128x256x64_w8x1_s4_wsp", "128x256x64_w8x1_s4_persist"},
      {"128x256x64_w8x1_s3_wsp_tma_tstore", "128x256x64_w8x1_s3_persist_tmacontig_tmastore"},
      {"128x256x64_w8x1_s3_ws_tstore", "128x256x64_w8x1_s3_ws_tmastore"},
      {"128x256x64_w8x1_s4_wsp_tma_swap", "128x256x64_w8x1_s4_persist_tmacontig_altorder"},
      {"128x128x64_w8x1_s3_wg_swap", "128x128x64_w8x1_s3_wgmma_altorder"},
      {"128x128x64_w4x1_s6_pp_tma", "128x128x64_w4x1_s6_pingpong_tmacontig"},
      {"128x128x64_w4x1_s4_pp_tma_tstore", "128x128x64_w4x1_s4_pingpong_tmacontig_tmastore"},
      {"128x256x64_w8x1_s4_wsp_tma_c2", "128x256x64_w8x1_s4_persist_tmacontig_cluster2x1"},
      {"64x256x64_w4x1_s5_pp_tma_swap_c2", "64x256x64_w4x1_s5_pingpong_tmacontig_altorder_cluster2x1"},
  };
  for (const auto& [old_name, name] : renamed) {
    INFO(old_name);
    CHECK(TileConfig::parse(old_name) == TileConfig::parse(name));
    CHECK(TileConfig::parse(old_name).to_string() == name);  // written in today's spelling
  }
  // A suffix is a whole word: neither spelling reads a prefix of a longer one, and the order
  // stays fixed.
  for (const char* bad : {"128x256x64_w8x1_s4_wspx", "128x256x64_w8x1_s4_wgm", "128x256x64_w8x1_s4_ws_tmac",
                          "128x256x64_w8x1_s4_ws_tmastoree", "128x256x64_w8x1_s4_persist_altorder_tmacontig",
                          "128x256x64_w8x1_s4_wsp_swap_tma", "128x256x64_w8x1_s4_persist_tmacontig_cluster2",
                          "128x256x64_w8x1_s4_persist_tmacontig_cluster2x2", "128x256x64_w8x1_s4_persist_c3",
                          "128x256x64_w8x1_s4_swap", "128x256x64_w8x1_s4_altorder", "128x128x64_w2x4_s3_c2"}) {
    INFO(bad);
    CHECK_THROWS_AS(TileConfig::parse(bad), InvalidArgument);
  }
}

TEST_CASE("vocabulary: the host's and the templates' mainloop names agree") {
  // gemm::Tile derives its flags and its block size from the same Mainloop (common.cuh) as
  // TileConfig: NVRTC checks the device side's values against the host's.
  std::string checks;
  const std::pair<Mainloop, const char*> mainloops[] = {{Mainloop::mma_sync, "mma_sync"},
                                                        {Mainloop::wgmma_multistage, "wgmma_multistage"},
                                                        {Mainloop::warp_specialized, "warp_specialized"},
                                                        {Mainloop::persistent, "persistent"},
                                                        {Mainloop::pingpong, "pingpong"}};
  for (const auto& [m, name] : mainloops) {
    const TileConfig t = m == Mainloop::mma_sync ? TileConfig{} : wgmma_tile(128, 128, 4, m);
    CHECK(t.wgmma() == uses_wgmma(m));
    CHECK(t.warp_specialized() == is_warp_specialized(m));
    CHECK(t.persistent() == is_persistent(m));
    const std::string cfg = fmt::format("moeblaze::gemm::Tile<{}, {}, {}, {}, {}, {}, 1, int(moeblaze::Mainloop::{})>",
                                        t.bm, t.bn, t.bk, t.warps_m, t.warps_n, t.stages, name);
    checks += fmt::format(
        "static_assert({0}::WGMMA == {2} && {0}::WARP_SPECIALIZED == {3} && {0}::PERSISTENT == {4} && "
        "{0}::PINGPONG == {5} && {0}::BLOCK_THREADS == {6}, \"mainloop {1}\");\n",
        cfg, name, t.wgmma(), t.warp_specialized(), t.persistent(), t.pingpong(), t.threads());
  }
  KernelSource src;
  src.kernel_name = "mainloop_names";
  src.file_name = "mainloop_names.cu";
  src.text = "#include \"moeblaze/gemm/tile.cuh\"\n" + checks + "extern \"C\" __global__ void mainloop_names() {}\n";
  INFO(src.text);
  CHECK_NOTHROW(compile_kernel(src, CompileOptions{}));
}

TEST_CASE("vocabulary: the generated glue names the mainloop") {
  LayerConfig l;
  l.shape = {8, 2, 256, 128};
  const GeneratedKernel g =
      generate(KernelSpec{KernelFamily::down_proj, l, tile(128, 256, 4, Mainloop::persistent, true), Arch::sm_90a});
  CHECK(g.source.text.find("int(moeblaze::Mainloop::persistent), 1, 0, 0>") != std::string::npos);
  CHECK(g.source.kernel_name.find("_128x256x64_w8x1_s4_persist_tmacontig") != std::string::npos);
}

TEST_CASE("vocabulary: target names") {
  CHECK(to_string(Arch::sm_90a) == "sm_90a");  // NVRTC's option and the binary cache keys' text
  CHECK(parse_arch("sm_90a") == Arch::sm_90a);
  CHECK(has_wgmma(Arch::sm_90a));
  for (const char* other : {"sm_80", "sm_86", "sm_89", "sm_100", "sm_120"}) {
    INFO(other);
    const Arch a = parse_arch(other);
    CHECK(to_string(a) == other);
    CHECK_FALSE(has_wgmma(a));
  }
  for (const char* bad : {"sm_90", "sm_90a --foo", "sm_86a", "sm_100a", "sm_", "sm_9", "sm_0090", "sm_09", "90a",
                          "compute_90a", "", "SM_90A"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_arch(bad), InvalidArgument);
  }
  DeviceInfo hopper;
  hopper.cc_major = 9;
  hopper.cc_minor = 0;
  CHECK(hopper.arch() == Arch::sm_90a);
  DeviceInfo ada;
  ada.cc_major = 8;
  ada.cc_minor = 9;
  CHECK(to_string(ada.arch()) == "sm_89");
}

TEST_CASE("vocabulary: kernel families and their older names") {
  const std::pair<KernelFamily, const char*> renamed[] = {{KernelFamily::gate_up, "up_proj"},
                                                         {KernelFamily::gate_up_wgrad, "up_wgrad"},
                                                         {KernelFamily::gate_up_dgrad, "up_dgrad"}};
  for (const auto& [f, older] : renamed) {
    INFO(older);
    CHECK(parse_family(older) == f);
    CHECK(parse_family(to_string(f)) == f);
    CHECK(family_names(f) == std::vector<std::string>{to_string(f), older});
  }
  CHECK(to_string(KernelFamily::gate_up) == "gate_up");
  CHECK(to_string(KernelFamily::gate_up_wgrad) == "gate_up_wgrad");
  CHECK(to_string(KernelFamily::gate_up_dgrad) == "gate_up_dgrad");
  for (KernelFamily f : all_families()) {
    CHECK(parse_family(to_string(f)) == f);
    CHECK(family_names(f).front() == to_string(f));
  }
  CHECK(family_names(KernelFamily::down_proj) == std::vector<std::string>{"down_proj"});
  CHECK_THROWS_AS(parse_family("up"), InvalidArgument);
  LayerConfig l;
  l.shape = {8, 2, 256, 128};
  CHECK(KernelSpec{KernelFamily::gate_up, l, TileConfig{}}.name().rfind("mb_gate_up_E8_K2_d256_n128_swiglu_", 0) == 0);
}

TEST_CASE("vocabulary: a cache's rows under the older names are read, imported and loaded") {
  using namespace cache_test;
  TempDir dir;
  LayerConfig layer;
  layer.shape = {8, 2, 256, 128};
  const std::string device = "test device", policy = "policy";
  const char* older_tile = "128x128x64_w8x1_s4_wsp_tma_swap";
  const TileConfig tile = TileConfig::parse("128x128x64_w8x1_s4_persist_tmacontig_altorder");
  // The import's row check takes both spellings.
  CHECK(tuning_row_problem("up_proj", older_tile).empty());
  CHECK(tuning_row_problem("up_dgrad", "128x256x64_w8x1_s4_ws_tma").empty());
  CHECK(tuning_row_problem("up", older_tile) == "unknown kernel family");

  // A winner and a measurement as an older revision's cache holds them: the family under its
  // older name, the tile in the older spelling.
  const std::string old_file = dir.file("old.db");
  {
    KernelCache old_cache(old_file);
    TuningKey key = tuning_key(KernelFamily::gate_up, layer, 4096, device, policy);
    key.family = "up_proj";
    old_cache.put_winner(Winner{key, older_tile, 1.0, 0.01, 2.0, 0});
    Measurement m;
    m.key = key;
    m.config = older_tile;
    m.median_ms = 1.0;
    m.samples = 10;
    old_cache.add_measurements({m});
  }
  KernelCache c(dir.file("kernels.db"));
  const ImportReport r = c.import_from(old_file, tuning_row_problem);
  CHECK(r.winners.taken == 1);
  CHECK(r.measurements.taken == 1);
  CHECK(r.skipped.empty());

  // The loader finds the winner for gate_up and runs its tile (legal for the layer, and not
  // its default: the default alone would pass unnoticed).
  REQUIRE(legality_problem(KernelSpec{KernelFamily::gate_up, layer, tile}).empty());
  REQUIRE_FALSE(tile == default_tile(KernelFamily::gate_up, layer, Arch::sm_90a, 4096));
  LoadReport report;
  const std::vector<KernelSpec> specs =
      choose_tiles(layer, Arch::sm_90a, device, &c, LoadOptions{4096, policy, {}}, report);
  bool found = false;
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].family == KernelFamily::gate_up) {
      found = true;
      CHECK(specs[i].tile == tile);
      CHECK(report.kernels[i].tile_source == TileSource::tuned_exact);
    }
  CHECK(found);
  CHECK(report.warnings.empty());
  // Without tuned lookups (a check of the defaults that takes only the cache's binaries) the
  // same cache leaves every tile at its default.
  LoadReport untuned;
  const std::vector<KernelSpec> defaults =
      choose_tiles(layer, Arch::sm_90a, device, &c, LoadOptions{4096, policy, {}, false}, untuned);
  REQUIRE(defaults.size() == specs.size());
  for (size_t i = 0; i < defaults.size(); ++i) {
    CHECK(defaults[i].tile == default_tile(defaults[i].family, layer, Arch::sm_90a, 4096));
    CHECK(untuned.kernels[i].tile_source == TileSource::default_tile);
  }
}

TEST_CASE("vocabulary: a regress baseline under the older names compares with today's kernels") {
  cache_test::TempDir dir;
  Baseline b;
  b.layer = find_preset("qwen3-30b-a3b").layer;
  b.tokens = 32768;
  b.kernels = {{"up_proj", "128x128x64_w8x1_s4_wsp_tma", 2.0, 0.02},
               {"up_wgrad", "128x256x64_w8x1_s3_wsp_tma_tstore", 3.0, 0.03},
               {"combine", "-", 0.5, 0.01}};
  const std::string path = (dir.path / "older.json").string();
  write_baseline(b, path);
  const Baseline read = read_baseline(path);
  REQUIRE(read.kernels.size() == 3);
  CHECK(read.kernels[0].family == "gate_up");
  CHECK(read.kernels[0].tile == "128x128x64_w8x1_s4_persist_tmacontig");
  CHECK(read.kernels[1].family == "gate_up_wgrad");
  CHECK(read.kernels[1].tile == "128x256x64_w8x1_s3_persist_tmacontig_tmastore");
  CHECK(read.kernels[2].tile == "-");
  Baseline now = read;  // what bench_layer reports: today's names
  const auto lines = compare_to_baseline(read, now, 0.10);
  for (const auto& l : lines) CHECK_FALSE(l.slower);
}
