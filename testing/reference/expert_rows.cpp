// expert_weight_grad_rows: weight gradients of one expert for a subset of FFN indices.
// Row i of dW1/dW3 and column i of dW2 need only A_i, B_i and (dy W2)_i of each slot, so a
// sample of rows costs a few dot products per slot instead of the expert's whole backward.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/parallel.hpp"
#include "reference.hpp"

namespace moeblaze::reference {

ExpertGrads expert_weight_grad_rows(const ExpertWeights& w, const bf16* x, const bf16* dy, const int32_t* ids,
                                    const double* gates, int64_t T, int K, int expert, const std::vector<int>& rows) {
  if (expert < 0 || expert >= w.E) throw std::invalid_argument("expert: outside [0, E)");
  for (int i : rows)
    if (i < 0 || i >= w.n) throw std::invalid_argument("rows: index " + std::to_string(i) + " outside [0, n)");
  const int64_t d = w.d, n = w.n, R = static_cast<int64_t>(rows.size());
  const bool gated = is_gated(w.act);
  // The expert's slots: token and gate.
  std::vector<int64_t> tok;
  std::vector<double> gate;
  for (int64_t s = 0; s < T * K; ++s)
    if (ids[s] == expert) {
      tok.push_back(s / K);
      gate.push_back(gates[s]);
    }
  const int64_t S = static_cast<int64_t>(tok.size());
  const int64_t base = static_cast<int64_t>(expert) * n * d;
  const int64_t gn = (gated ? 2 : 1) * n;
  ExpertGrads g;
  g.dw1.assign(R * d, 0.0);
  if (gated) g.dw3.assign(R * d, 0.0);
  g.dw2.assign(d * R, 0.0);
  if (w.b_up) {
    g.d_bias_up.assign((gated ? 2 : 1) * R, 0.0);
    g.d_bias_down.assign(d, 0.0);
    for (int64_t s = 0; s < S; ++s)  // sum of g dy over the expert's slots
      for (int64_t c = 0; c < d; ++c) g.d_bias_down[c] += gate[s] * to_float(dy[tok[s] * d + c]);
  }
  // Each thread owns a set of rows r: no shared writes, slots summed in order.
  auto work = [&](int64_t r0, int64_t r1) {
    std::vector<double> w1r(d), w3r(d), w2c(d), xr(d), dyr(d);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = rows[r];
      for (int64_t c = 0; c < d; ++c) {
        w1r[c] = to_float(w.w1[base + i * d + c]);
        if (gated) w3r[c] = to_float(w.w3[base + i * d + c]);
        w2c[c] = to_float(w.w2[base + c * n + i]);
      }
      for (int64_t s = 0; s < S; ++s) {
        double a = 0, b = 0, u = 0;
        for (int64_t c = 0; c < d; ++c) {
          xr[c] = to_float(x[tok[s] * d + c]);
          dyr[c] = to_float(dy[tok[s] * d + c]);
          a += xr[c] * w1r[c];
          if (gated) b += xr[c] * w3r[c];
          u += dyr[c] * w2c[c];
        }
        if (w.b_up) {
          a += to_float(w.b_up[expert * gn + i]);
          if (gated) b += to_float(w.b_up[expert * gn + n + i]);
        }
        const double act = activation(w.act, a), dact = activation_grad(w.act, a);
        const double up = gated ? up_factor(w.act, b) : 1.0;
        const double h = act * up;
        const double dh = gate[s] * u;
        const double da = dh * up * dact;
        const double db = gated ? dh * act * up_factor_grad(w.act, b) : 0.0;
        if (w.b_up) {
          g.d_bias_up[r] += da;
          if (gated) g.d_bias_up[R + r] += db;
        }
        for (int64_t c = 0; c < d; ++c) {
          g.dw1[r * d + c] += da * xr[c];
          if (gated) g.dw3[r * d + c] += db * xr[c];
          g.dw2[c * R + r] += gate[s] * dyr[c] * h;
        }
      }
    }
  };
  parallel_ranges(R, work, 1);
  return g;
}

}  // namespace moeblaze::reference
