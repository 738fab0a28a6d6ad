// The pass criteria of a GPU layer check, shared by the GPU tests: every error line within
// the tolerance (exact lines exactly 0), every output element written, two runs bitwise
// identical; one line of numbers per case in the log.
#pragma once
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>

#include "testing/layer_check.hpp"

namespace moeblaze::tests {

inline void check_layer_result(const std::string& name, const LayerCheckResult& r, double tolerance) {
  INFO(name);
  for (const auto& e : r.errors) {
    INFO(e.name, " rel error ", e.rel_error);
    if (e.exact) CHECK(e.rel_error == 0);
    else CHECK(e.rel_error <= tolerance);
  }
  INFO("unwritten: ", r.unwritten, "; differs: ", r.differs);
  CHECK(r.all_written);
  CHECK(r.bitwise_identical);
  MESSAGE(fmt::format("{}: max rel error {:.2e}, fwd {:.3f} ms, bwd {:.3f} ms", name, r.max_error(), r.forward_ms,
                      r.backward_ms));
}

}  // namespace moeblaze::tests
