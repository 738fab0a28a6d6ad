// Entry hook of the GPU test program (tests/doctest_main.cpp calls it before doctest): its
// usage with --help, and exit code 77 (CTest: skipped) with the reason when there is no GPU.
#include <cstdio>
#include <string>

#include "runtime/cuda_driver.hpp"

namespace {

constexpr const char* kUsage = R"(moeblaze_gpu_tests: the layer on a GPU against the CPU reference.
  gpu: ...               cases of shapes, activations, routers, routing kinds, checkpoint modes
  gpu table: fast rows   every tile kind on one small shape (tests/tables/tile_table.cpp)
  gpu table: full sweep  each kind's other small shapes, both checkpoint modes, the suite presets
                         per kind and the mma.sync tiles; runs with MOEBLAZE_GPU_SWEEP=1 or
                         --no-skip (ctest --test-dir build -L sweep)
Rows are subcases named "kind / shape / mode": -tc="gpu table*" -sc="*tmastore*" runs one kind,
-sc="*deepseek-v3*" one shape. Kernels are compiled into the cache MOEBLAZE_CACHE names (a
second run compiles nothing). Exit code 77 without a GPU. doctest's own options follow.
)";

}  // namespace

int moeblaze_test_main_hook(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || a == "-?") {
      std::fputs(kUsage, stdout);
      return -1;  // doctest prints its options
    }
  }
  std::string why;
  if (!moeblaze::gpu_available(&why)) {
    std::printf("SKIPPED: GPU tests need a GPU: %s\n", why.c_str());
    return 77;
  }
  return -1;  // run doctest
}
