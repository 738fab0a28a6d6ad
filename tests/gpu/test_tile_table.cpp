// The GPU regression table (tests/tables/tile_table.hpp): every row a grad-check of the layer
// against the CPU reference with the row's tiles: every output and gradient within 1e-2
// (index arrays, counts and picks exactly), every output element written (outputs start as
// NaN), and two runs bitwise identical.
//
// Usage (also printed by `moeblaze_gpu_tests --help`):
//   ctest --test-dir build -L gpu               the fast rows (one small shape per tile kind)
//   ctest --test-dir build -L sweep             the full sweep: each kind's other small shapes,
//                                               both checkpoint modes, the suite presets per kind,
//                                               the mma.sync tiles
//   build/bin/moeblaze_gpu_tests -tc="gpu table*" -sc="*tmastore*"   one kind (doctest filters on
//                                               the row name "kind / shape / mode")
//   MOEBLAZE_GPU_SWEEP=1 build/bin/moeblaze_gpu_tests   the full sweep too (as --no-skip does)
// Kernels are compiled into the cache MOEBLAZE_CACHE names (default ~/.cache/moeblaze/kernels.db),
// so a second run compiles nothing; every family's tile is forced, so tuned winners in that
// cache do not change what a row runs.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdlib>

#include "cache/kernel_cache.hpp"
#include "check_result.hpp"
#include "runtime/cuda_driver.hpp"
#include "tables/tile_table.hpp"
#include "testing/layer_check.hpp"

using namespace moeblaze;

namespace {

bool sweep_requested() {
  const char* v = std::getenv("MOEBLAZE_GPU_SWEEP");
  return v && *v && std::string(v) != "0";
}

// The cache every row compiles into, opened once.
KernelCache& run_cache() {
  static KernelCache cache(KernelCache::default_path());
  return cache;
}

void check_row(const tables::TableRow& row) {
  LayerCheckOptions o = tables::check_options(row);
  o.cache = &run_cache();
  tests::check_layer_result(row.name(), run_layer_check(o), o.tolerance);
}

}  // namespace

TEST_CASE("gpu table: fast rows (one small shape per tile kind)") {
  DeviceContext ctx(0);
  for (const tables::TableRow& row : tables::fast_rows())
    SUBCASE(row.name().c_str()) { check_row(row); }
}

TEST_CASE("gpu table: full sweep (more small shapes, both modes, suite presets, mma.sync)" *
          doctest::skip(!sweep_requested())) {
  DeviceContext ctx(0);
  for (const tables::TableRow& row : tables::sweep_rows())
    SUBCASE(row.name().c_str()) { check_row(row); }
}
