// The rules that have one implementation each (docs/layers.md): the worker pool, FNV-1a, the
// tile a following family takes, the peak-memory formula, the token bucket, and how a kernel
// is obtained (cache hit, compile, or a recorded failure).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/errors.hpp"
#include "core/hash.hpp"
#include "core/parallel.hpp"
#include "generator/heuristics.hpp"
#include "runtime/cache_keys.hpp"
#include "runtime/kernel_build.hpp"
#include "runtime/layer_buffers.hpp"
#include "runtime/moe_layer.hpp"

using namespace moeblaze;
namespace fs = std::filesystem;

TEST_CASE("parallel_tasks runs every index once, on several threads, and rethrows the first failure") {
  for (unsigned threads : {1u, 3u, 0u}) {
    std::vector<std::atomic<int>> seen(1000);
    parallel_tasks(1000, [&](int64_t i) { seen[i]++; }, threads);
    CHECK(std::all_of(seen.begin(), seen.end(), [](const std::atomic<int>& v) { return v == 1; }));
  }
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH_AS(parallel_tasks(
                           100,
                           [&](int64_t i) {
                             ++ran;
                             if (i == 5) throw std::runtime_error("task 5 failed");
                             // Tasks take a while, as real ones do: without it the second thread
                             // could finish all 100 before the first failure is seen.
                             std::this_thread::sleep_for(std::chrono::milliseconds(2));
                           },
                           2),
                       "task 5 failed", std::runtime_error);
  CHECK(ran < 100);  // no new task starts after a failure
  parallel_tasks(0, [](int64_t) { FAIL("no task for an empty range"); });
}

TEST_CASE("parallel_ranges covers [0, n) with disjoint ranges") {
  for (int64_t n : {int64_t{1}, int64_t{4095}, int64_t{100000}}) {
    std::vector<int> seen(n, 0);
    parallel_ranges(n, [&](int64_t b, int64_t e) {
      CHECK(b < e);
      for (int64_t i = b; i < e; ++i) seen[i]++;
    });
    CHECK(std::count(seen.begin(), seen.end(), 1) == n);
  }
}

TEST_CASE("fnv1a64: published vectors, and a seed continues a hash") {
  CHECK(fnv1a64("") == kFnv1aOffsetBasis);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
  CHECK(fnv1a64(std::string_view("bar"), fnv1a64("foo")) == fnv1a64("foobar"));
}

TEST_CASE("gate_grad follows down_dgrad's tile: defaults, forced tiles, and kernel names") {
  LayerConfig l;
  l.shape = {8, 2, 256, 128};
  CHECK(tile_follows(KernelFamily::gate_grad) == KernelFamily::down_dgrad);
  CHECK_FALSE(tile_follows(KernelFamily::down_dgrad).has_value());
  for (Arch arch : {Arch::sm_90a, parse_arch("sm_80")})
    CHECK(default_tile(KernelFamily::gate_grad, l, arch) == default_tile(KernelFamily::down_dgrad, l, arch));
  std::vector<KernelSpec> specs = layer_kernel_specs(l, Arch::sm_90a);
  const TileConfig forced = wgmma_tile(128, 128, 4, Mainloop::persistent);
  for (auto& s : specs)
    if (s.family == KernelFamily::down_dgrad) s.tile = forced;
  tie_following_tiles(specs);
  int followers = 0;
  for (const auto& s : specs)
    if (s.family == KernelFamily::gate_grad) {
      CHECK(s.tile == forced);
      CHECK(s.name().find(forced.to_string()) != std::string::npos);
      ++followers;
    }
  CHECK(followers == 1);
}

TEST_CASE("peak_bytes: saved, the larger scratch, y and (with a backward) dx") {
  LayerConfig l;
  l.shape = {16, 4, 256, 512};
  const int64_t T = 1000;
  for (CheckpointMode m : {CheckpointMode::save_h, CheckpointMode::recompute}) {
    const MemoryPlan p = plan_memory(l, T, m, 128);
    const size_t io = size_t(T) * 256 * 2;
    const size_t larger = std::max(p.forward_scratch_bytes, p.backward_scratch_bytes);
    CHECK(peak_bytes(p, l, T) == p.saved_bytes + larger + 2 * io);
    CHECK(peak_bytes(p, l, T, false) == p.saved_bytes + larger + io);
  }
}

TEST_CASE("token_bucket: the next power of two, refused above 2^62") {
  CHECK(token_bucket(0) == 1);
  CHECK(token_bucket(1) == 1);
  CHECK(token_bucket(3) == 4);
  CHECK(token_bucket(4096) == 4096);
  CHECK(token_bucket(4097) == 8192);
  CHECK(token_bucket(int64_t{1} << 62) == int64_t{1} << 62);
  try {
    token_bucket((int64_t{1} << 62) + 1);
    FAIL("a token count above 2^62 was bucketed");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument == "tokens");
  }
}

TEST_CASE("build_kernels: a failing spec is recorded and the others are built, cached, then fetched") {
  const fs::path dir = fs::temp_directory_path() / ("moeblaze_build_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    KernelCache cache((dir / "k.db").string());
    LayerConfig l;
    l.shape = {8, 2, 128, 128};
    std::vector<KernelSpec> specs;
    for (const auto& s : layer_kernel_specs(l, Arch::sm_90a))
      if (s.family == KernelFamily::combine || s.family == KernelFamily::down_proj) specs.push_back(s);
    KernelSpec bad = specs.back();
    bad.family = KernelFamily::down_proj;
    bad.tile.bk = 32;  // illegal: generate() refuses it
    specs.push_back(bad);

    BuildCounts first;
    std::vector<KernelBuild> a = build_kernels(specs, BuildOptions{&cache}, &first);
    CHECK(first.compiled == 2);
    CHECK(first.from_cache == 0);
    CHECK(first.failed == 1);
    REQUIRE(a[0].kernel.has_value());
    REQUIRE(a[1].kernel.has_value());
    CHECK_FALSE(a[2].kernel.has_value());
    CHECK(a[2].error_text().find("bk") != std::string::npos);
    CHECK_THROWS_AS(build_all(specs, BuildOptions{&cache}), InvalidArgument);

    specs.pop_back();
    BuildCounts second;
    std::vector<BuiltKernel> b = build_all(specs, BuildOptions{&cache}, &second);
    CHECK(second.from_cache == 2);
    CHECK(second.compiled == 0);
    CHECK(second.compile_ms == 0);
    for (size_t i = 0; i < b.size(); ++i) {
      CHECK(b[i].from_cache);
      CHECK(b[i].compiled.cubin == a[i].kernel->compiled.cubin);
    }
    // Keeping the PTX compiles again (a cached binary has none).
    BuildCounts third;
    std::vector<BuiltKernel> c = build_all(specs, BuildOptions{&cache, 0, true}, &third);
    CHECK(third.compiled == 2);
    for (const BuiltKernel& k : c) CHECK_FALSE(k.compiled.ptx.empty());
  }
  fs::remove_all(dir);
}

TEST_CASE("router_wgrad_splits: every part holds tokens, the parts fit their room, one wave of blocks") {
  using detail::ceil_div;
  for (int64_t T : {int64_t{1}, int64_t{100}, int64_t{513}, int64_t{4096}, int64_t{16384}, int64_t{32768}, int64_t{1} << 20})
    for (int E : {8, 128, 256, 512})
      for (int d : {64, 2048, 2880, 7168})
        for (size_t room : {size_t{0}, size_t{1} << 20, size_t{1} << 30}) {
          const int bm = 128, bn = 256, bk = 64;
          const int s = detail::router_wgrad_splits(T, E, d, bm, bn, bk, room);
          CAPTURE(T); CAPTURE(E); CAPTURE(d); CAPTURE(room); CAPTURE(s);
          REQUIRE(s >= 1);
          if (s == 1) continue;
          const int64_t span = ceil_div(ceil_div(T, s), bk) * bk;  // router.cuh wgrad_gemm's ranges
          CHECK((s - 1) * span < T);                                 // the last part is not empty
          CHECK(static_cast<size_t>(s) * E * d * 4 <= room);
          CHECK(T / s >= detail::kRouterWgradMinTokens - bk);
          const int64_t tiles = ceil_div(detail::padded_experts(E), bm) * ceil_div(d, bn);
          CHECK(tiles * s <= detail::kRouterWgradBlocks);
        }
  // The suite's router layers: qwen3-30b-a3b (8 tiles) splits 16 ways, deepseek-v3 (56) twice.
  CHECK(detail::router_wgrad_splits(32768, 128, 2048, 128, 256, 64, size_t{1} << 30) == 16);
  CHECK(detail::router_wgrad_splits(16384, 256, 7168, 128, 256, 64, size_t{1} << 30) == 2);
}
