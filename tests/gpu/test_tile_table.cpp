// The GPU regression table (tests/tables/tile_table.hpp): every row a grad-check of the layer
// against the CPU reference with the row's tiles: every output and gradient within 1e-2
// (index arrays, counts and picks exactly), every output element written (outputs start as
// NaN), and two runs bitwise identical.
//
// Usage (also printed by `moeblaze_gpu_tests --help`):
//   ctest --test-dir build -L gpu               the fast rows (small shapes, every tile kind)
//   ctest --test-dir build -L sweep             the full sweep: the fast rows in the other
//                                               checkpoint mode, the suite presets per kind, mma.sync
//   build/bin/moeblaze_gpu_tests -tc="gpu table*" -sc="*tstore*"   one kind (doctest filters on
//                                               the row name "kind / shape / mode")
//   MOEBLAZE_GPU_SWEEP=1 build/bin/moeblaze_gpu_tests   the full sweep too (as --no-skip does)
// Kernels are compiled once per tile and shape into a cache file of this run (removed at exit).
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

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

// One cache file for the whole run, so that rows sharing a shape and tile compile once.
KernelCache& run_cache() {
  struct Owned {
    std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                fmt::format("moeblaze_gpu_table_{}", ::getpid());
    std::unique_ptr<KernelCache> cache;
    Owned() {
      std::filesystem::create_directories(dir);
      cache = std::make_unique<KernelCache>((dir / "kernels.db").string());
    }
    ~Owned() {
      cache.reset();
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  };
  static Owned owned;
  return *owned.cache;
}

void check_row(const tables::TableRow& row) {
  LayerCheckOptions o = tables::check_options(row);
  o.cache = &run_cache();  // a fresh cache holds no winners: the row's tiles and the defaults
  tests::check_layer_result(row.name(), run_layer_check(o), o.tolerance);
}

}  // namespace

TEST_CASE("gpu table: fast rows (every tile kind on small shapes)") {
  DeviceContext ctx(0);
  for (const tables::TableRow& row : tables::fast_rows())
    SUBCASE(row.name().c_str()) { check_row(row); }
}

TEST_CASE("gpu table: full sweep (other checkpoint mode, suite presets, mma.sync)" *
          doctest::skip(!sweep_requested())) {
  DeviceContext ctx(0);
  for (const tables::TableRow& row : tables::sweep_rows())
    SUBCASE(row.name().c_str()) { check_row(row); }
}
