// The names of docs/design.md's glossary, no GPU: tile names and target names
// round-trip, the older spellings still read as the same configurations (cache rows, baselines
// and command lines that hold them keep working), and the host's and the templates' names of a
// mainloop agree.
#include <doctest/doctest.h>

#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/errors.hpp"
#include "generator/kernel_spec.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/nvrtc_compiler.hpp"

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
      {tile(128, 256, 4, Mainloop::persistent, true, false, true), "128x256x64_w8x1_s4_persist_tmacontig_altorder"},
      {tile(128, 256, 4, Mainloop::persistent, true, false, false, 2), "128x256x64_w8x1_s4_persist_tmacontig_cluster2x1"},
      {tile(64, 256, 5, Mainloop::pingpong, true, false, true, 2),
       "64x256x64_w4x1_s5_pingpong_tmacontig_altorder_cluster2x1"},
  };
  for (const auto& [t, name] : names) {
    INFO(name);
    CHECK(t.to_string() == name);
    CHECK(TileConfig::parse(name) == t);
  }
}

TEST_CASE("vocabulary: the older tile suffixes read as the same configurations") {
  // Older spelling -> today's: _wg, _wsp, _pp, _tma, _tstore, _swap, _c2 (cache rows, the
  // regress baselines and command lines written before the renames hold them).
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
