// expert_weight_grad_rows (sampled FFN rows) must equal the matching rows of the full
// expert_weight_grads, which the finite-difference tests check.
#include <doctest/doctest.h>

#include <cmath>

#include "testing/host_data.hpp"
#include "testing/reference/reference.hpp"

using namespace moeblaze;

TEST_CASE("reference: weight gradients of sampled FFN rows equal the full ones") {
  for (Activation act : {Activation::swiglu, Activation::gelu}) {
    const int E = 4, K = 2, d = 24, n = 16;
    const int64_t T = 9;
    const bool gated = is_gated(act);
    std::vector<bf16> x(T * d), dy(T * d), w1(E * n * d), w3(gated ? E * n * d : 0), w2(E * d * n);
    fill_uniform(x, 1.f, 1);
    fill_uniform(dy, 1.f, 2);
    fill_uniform(w1, 0.3f, 3);
    if (gated) fill_uniform(w3, 0.3f, 4);
    fill_uniform(w2, 0.3f, 5);
    std::vector<int32_t> ids(T * K);
    std::vector<double> gates(T * K);
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < K; ++j) {
        ids[t * K + j] = static_cast<int32_t>((t + j) % E);
        gates[t * K + j] = 0.2 + 0.1 * j + 0.01 * t;
      }
    reference::ExpertWeights w{w1.data(), gated ? w3.data() : nullptr, w2.data(), E, d, n, act};
    const std::vector<int> rows = {0, 3, 7, 15};
    for (int e = 0; e < E; ++e) {
      const auto full = reference::expert_weight_grads(w, x.data(), dy.data(), ids.data(), gates.data(), T, K, e);
      const auto part =
          reference::expert_weight_grad_rows(w, x.data(), dy.data(), ids.data(), gates.data(), T, K, e, rows);
      double norm = 0;
      for (size_t r = 0; r < rows.size(); ++r)
        for (int c = 0; c < d; ++c) {
          CHECK(part.dw1[r * d + c] == doctest::Approx(full.dw1[rows[r] * d + c]).epsilon(1e-12));
          if (gated) CHECK(part.dw3[r * d + c] == doctest::Approx(full.dw3[rows[r] * d + c]).epsilon(1e-12));
          CHECK(part.dw2[c * rows.size() + r] == doctest::Approx(full.dw2[c * n + rows[r]]).epsilon(1e-12));
          norm += std::abs(full.dw1[rows[r] * d + c]);
        }
      CHECK(norm > 0);  // not a vacuous comparison of zeros
    }
  }
}
