// Shared doctest entry point. The GPU test program overrides nothing here: it decides
// per test whether a GPU is present (tests/gpu/gpu_fixture.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>

int moeblaze_test_main_hook(int argc, char** argv);  // defined weakly below, GPU tests override

__attribute__((weak)) int moeblaze_test_main_hook(int, char**) { return -1; }

int main(int argc, char** argv) {
  if (int rc = moeblaze_test_main_hook(argc, argv); rc >= 0) return rc;
  doctest::Context context(argc, argv);
  return context.run();
}
