// The index build's three kernels of a small layer: real kernels that compile in a fraction of a
// second, for the tests of the build machinery (progress, compiling in child processes).
#pragma once
#include <doctest/doctest.h>

#include <vector>

#include "generator/heuristics.hpp"

namespace moeblaze::test_util {

inline std::vector<KernelSpec> index_build_specs() {
  LayerConfig l;
  l.shape = {8, 2, 64, 64};
  std::vector<KernelSpec> out;
  for (const KernelSpec& s : layer_kernel_specs(l, Arch::sm_90a))
    if (s.family == KernelFamily::index_count || s.family == KernelFamily::index_scan ||
        s.family == KernelFamily::index_scatter)
      out.push_back(s);
  REQUIRE(out.size() == 3);
  return out;
}

}  // namespace moeblaze::test_util
