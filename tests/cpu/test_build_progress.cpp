// Progress of a build (runtime/kernel_build.hpp): a count per compile with an estimate, none
// when the cache has every kernel, and the process's listener for builds that name none.
#include <doctest/doctest.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "cache_test_util.hpp"
#include "generator/heuristics.hpp"
#include "index_build_specs.hpp"
#include "runtime/kernel_build.hpp"

using namespace moeblaze;

using test_util::index_build_specs;

TEST_CASE("build progress: the line counts and estimates") {
  CHECK(BuildProgress{0, 108, 0.2}.line("candidates") == "compiled 0 of 108 candidates, 0s");
  CHECK(BuildProgress{36, 108, 40}.line("candidates") == "compiled 36 of 108 candidates, 40s, about 1m20s left");
  CHECK(BuildProgress{108, 108, 125}.line() == "compiled 108 of 108 kernels, 2m05s");
}

TEST_CASE("build progress: one call before the compiles and one after each, none when all are cached") {
  cache_test::TempDir dir;
  KernelCache cache(dir.file("k.db"));
  const auto specs = index_build_specs();
  std::mutex m;
  std::vector<BuildProgress> seen;
  BuildOptions o{&cache};
  o.progress = [&](const BuildProgress& p) {
    std::lock_guard lock(m);
    seen.push_back(p);
  };
  BuildCounts counts;
  build_kernels(specs, o, &counts);
  REQUIRE(counts.compiled == 3);
  REQUIRE(seen.size() == 4);
  CHECK(seen.front().done == 0);
  for (size_t i = 0; i < seen.size(); ++i) {
    CHECK(seen[i].done == static_cast<int>(i));
    CHECK(seen[i].total == 3);
    if (i) CHECK(seen[i].seconds >= seen[i - 1].seconds);
  }
  seen.clear();
  BuildCounts again;
  build_kernels(specs, o, &again);
  CHECK(again.from_cache == 3);
  CHECK(seen.empty());
}

TEST_CASE("build progress: the process's listener hears builds that name no callback") {
  const auto specs = index_build_specs();
  std::mutex m;
  int calls = 0, last_done = -1;
  set_build_progress_listener([&](const BuildProgress& p) {
    std::lock_guard lock(m);
    ++calls;
    last_done = std::max(last_done, p.done);
  });
  compile_all(specs);
  set_build_progress_listener({});
  CHECK(calls == 4);
  CHECK(last_done == 3);
  compile_all({specs.front()});  // no listener any more
  CHECK(calls == 4);
}

TEST_CASE("build progress: a callback that throws fails no kernel") {
  const auto specs = index_build_specs();
  BuildOptions o;
  o.progress = [](const BuildProgress&) { throw std::runtime_error("progress display broke"); };
  BuildCounts counts;
  const auto builds = build_kernels(specs, o, &counts);
  CHECK(counts.compiled == 3);
  CHECK(counts.failed == 0);
}
