// Tests of the CPU reference (testing/reference). The reference is what every GPU check
// trusts, so it is checked here against things that do not share its code: the worked
// example of docs/design.md, invariants, a small independent double-precision model written below,
// and central finite differences of the scalar loss L = sum_t <y_t, dy_t>.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "testing/reference/reference.hpp"

namespace ref = moeblaze::reference;
using moeblaze::Activation;
using moeblaze::bf16;
using moeblaze::RouterKind;

namespace {

const Activation kActivations[] = {Activation::swiglu, Activation::geglu, Activation::silu, Activation::gelu,
                                   Activation::relu,   Activation::clamped_swiglu};

// Random bf16 values in [-scale, scale], never (near) zero, and their exact double values.
void random_bf16(std::mt19937_64& rng, size_t count, double scale, std::vector<bf16>& b, std::vector<double>& d) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  b.resize(count);
  d.resize(count);
  for (size_t i = 0; i < count; ++i) {
    double v;
    do v = u(rng); while (std::abs(v) < 1e-2);
    b[i] = moeblaze::to_bf16(float(v * scale));
    d[i] = moeblaze::to_float(b[i]);
  }
}

// K distinct random experts per token, token-major.
std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t T, int E, int K) {
  std::vector<int32_t> ids, perm(E);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    ids.insert(ids.end(), perm.begin(), perm.begin() + K);
  }
  return ids;
}

std::vector<int64_t> all_tokens(int64_t T) {
  std::vector<int64_t> t(T);
  std::iota(t.begin(), t.end(), 0);
  return t;
}

// ---- an independent double-precision model ------------------------------------------

double local_act(Activation act, double a) {
  switch (act) {
    case Activation::swiglu:
    case Activation::silu: return a / (1.0 + std::exp(-a));
    case Activation::geglu:
    case Activation::gelu: return 0.5 * a * (1.0 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
    case Activation::relu: return std::max(a, 0.0);
    case Activation::clamped_swiglu: {  // GPT-OSS: min(a, 7) sigmoid(1.702 min(a, 7))
      const double m = std::min(a, 7.0);
      return m / (1.0 + std::exp(-1.702 * m));
    }
  }
  return 0;
}

// The up factor of a gated activation: b, or GPT-OSS's clamp(b, -7, 7) + 1.
double local_up(Activation act, double b) {
  return act == Activation::clamped_swiglu ? std::max(-7.0, std::min(b, 7.0)) + 1.0 : b;
}

// One MoE layer problem: bf16 inputs plus exact double copies (which the finite
// differences perturb; bf16 is far too coarse for that).
struct Problem {
  int T, E, K, d, n;
  Activation act;
  std::vector<bf16> x, w1, w3, w2, wr, dy;
  std::vector<double> xd, w1d, w3d, w2d, wrd, dyd;
  std::vector<int32_t> ids;
  std::vector<double> gates;
  std::vector<bf16> bu, bd;     // expert biases [E, G*n], [E, d] (empty: none)
  std::vector<double> bud, bdd;
  bool gated() const { return moeblaze::is_gated(act); }
  ref::ExpertWeights weights() const {
    return {w1.data(), gated() ? w3.data() : nullptr, w2.data(), E, d, n, act,
            bu.empty() ? nullptr : bu.data(), bd.empty() ? nullptr : bd.data()};
  }
  void add_biases(uint64_t seed, double scale) {
    std::mt19937_64 rng(seed);
    random_bf16(rng, size_t(E) * (gated() ? 2 : 1) * n, scale, bu, bud);
    random_bf16(rng, size_t(E) * d, scale, bd, bdd);
  }
};

Problem make_problem(uint64_t seed, int T, int E, int K, int d, int n, Activation act) {
  std::mt19937_64 rng(seed);
  Problem p{T, E, K, d, n, act, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  random_bf16(rng, size_t(T) * d, 1.0, p.x, p.xd);
  random_bf16(rng, size_t(E) * n * d, 2.0 / std::sqrt(d), p.w1, p.w1d);
  if (p.gated()) random_bf16(rng, size_t(E) * n * d, 2.0 / std::sqrt(d), p.w3, p.w3d);
  random_bf16(rng, size_t(E) * d * n, 1.0 / std::sqrt(n), p.w2, p.w2d);
  random_bf16(rng, size_t(E) * d, 3.0 / std::sqrt(d), p.wr, p.wrd);
  random_bf16(rng, size_t(T) * d, 1.0, p.dy, p.dyd);
  p.ids = random_ids(rng, T, E, K);
  std::uniform_real_distribution<double> g(0.1, 1.0);
  for (int i = 0; i < T * K; ++i) p.gates.push_back(g(rng));
  return p;
}

// Expert forward of one slot from the double arrays: A, h (n) and o (d).
void local_slot(const Problem& p, int t, int e, std::vector<double>& a, std::vector<double>& b,
                std::vector<double>& h, std::vector<double>& o) {
  a.assign(p.n, 0.0), b.assign(p.n, 0.0), h.assign(p.n, 0.0), o.assign(p.d, 0.0);
  const size_t gn = size_t(p.gated() ? 2 : 1) * p.n;
  for (int i = 0; i < p.n; ++i) {
    for (int c = 0; c < p.d; ++c) {
      a[i] += p.xd[size_t(t) * p.d + c] * p.w1d[(size_t(e) * p.n + i) * p.d + c];
      if (p.gated()) b[i] += p.xd[size_t(t) * p.d + c] * p.w3d[(size_t(e) * p.n + i) * p.d + c];
    }
    if (!p.bud.empty()) {
      a[i] += p.bud[e * gn + i];
      if (p.gated()) b[i] += p.bud[e * gn + p.n + i];
    }
    h[i] = local_act(p.act, a[i]) * (p.gated() ? local_up(p.act, b[i]) : 1.0);
  }
  for (int c = 0; c < p.d; ++c) {
    for (int i = 0; i < p.n; ++i) o[c] += p.w2d[(size_t(e) * p.d + c) * p.n + i] * h[i];
    if (!p.bdd.empty()) o[c] += p.bdd[size_t(e) * p.d + c];
  }
}

std::vector<double> local_forward(const Problem& p, const std::vector<double>& gates) {
  std::vector<double> y(size_t(p.T) * p.d, 0.0), a, b, h, o;
  for (int t = 0; t < p.T; ++t)
    for (int j = 0; j < p.K; ++j) {
      local_slot(p, t, p.ids[t * p.K + j], a, b, h, o);
      for (int c = 0; c < p.d; ++c) y[size_t(t) * p.d + c] += gates[t * p.K + j] * o[c];
    }
  return y;
}

double local_loss(const Problem& p, const std::vector<double>& gates) {
  const auto y = local_forward(p, gates);
  return std::inner_product(y.begin(), y.end(), p.dyd.begin(), 0.0);
}

// Gates from logits for a fixed selection, written from the definitions.
std::vector<double> local_gates(const ref::RouterSpec& spec, const std::vector<double>& logits,
                                const std::vector<int32_t>& ids, int T, int E, int K) {
  std::vector<double> g(size_t(T) * K);
  for (int t = 0; t < T; ++t) {
    std::vector<double> p(E);
    double z = 0;
    for (int e = 0; e < E; ++e) {
      const double l = logits[size_t(t) * E + e];
      p[e] = spec.kind == RouterKind::softmax_topk ? std::exp(l) : 1.0 / (1.0 + std::exp(-l));
      z += p[e];
    }
    double picked = 0;
    for (int j = 0; j < K; ++j) picked += p[ids[t * K + j]] / (spec.kind == RouterKind::softmax_topk ? z : 1.0);
    for (int j = 0; j < K; ++j) {
      double v = p[ids[t * K + j]] / (spec.kind == RouterKind::softmax_topk ? z : 1.0);
      if (spec.renormalize) v /= picked;
      g[t * K + j] = v * spec.route_scale;
    }
  }
  return g;
}

std::vector<double> local_logits(const Problem& p) {
  std::vector<double> l(size_t(p.T) * p.E, 0.0);
  for (int t = 0; t < p.T; ++t)
    for (int e = 0; e < p.E; ++e)
      for (int c = 0; c < p.d; ++c) l[size_t(t) * p.E + e] += p.xd[size_t(t) * p.d + c] * p.wrd[size_t(e) * p.d + c];
  return l;
}

// Central differences of loss() with respect to every element of v (restored after).
template <class F>
std::vector<double> central_diff(std::vector<double>& v, F&& loss, double h = 1e-5) {
  std::vector<double> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double up = loss();
    v[i] = keep - h;
    const double down = loss();
    v[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

double rel(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  return ref::relative_error(got.data(), want.data(), got.size());
}

// Concatenation of expert_weight_grads over all experts: [E,n,d], [E,n,d], [E,d,n].
ref::ExpertGrads all_weight_grads(const Problem& p) {
  ref::ExpertGrads all;
  for (int e = 0; e < p.E; ++e) {
    const auto g = ref::expert_weight_grads(p.weights(), p.x.data(), p.dy.data(), p.ids.data(), p.gates.data(), p.T,
                                            p.K, e);
    all.dw1.insert(all.dw1.end(), g.dw1.begin(), g.dw1.end());
    all.dw3.insert(all.dw3.end(), g.dw3.begin(), g.dw3.end());
    all.dw2.insert(all.dw2.end(), g.dw2.begin(), g.dw2.end());
    all.d_bias_up.insert(all.d_bias_up.end(), g.d_bias_up.begin(), g.d_bias_up.end());
    all.d_bias_down.insert(all.d_bias_down.end(), g.d_bias_down.begin(), g.d_bias_down.end());
  }
  return all;
}

template <class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

}  // namespace

// Suite and case names both say "reference", so -ts='*reference*' and -tc='reference:*' work.
TEST_SUITE_BEGIN("reference");

// ---- index build -------------------------------------------------------------------

TEST_CASE("reference: build_index reproduces the worked example of docs/design.md") {
  const std::vector<int32_t> ids{2, 3, 0, 1, 0, 3, 1, 2, 0, 3};
  const auto ix = ref::build_index(ids.data(), 5, 2, 4);
  CHECK(ix.expert_token_indices == std::vector<int32_t>{1, 2, 4, 1, 3, 0, 3, 0, 2, 4});
  CHECK(ix.expert_token_offsets == std::vector<int32_t>{0, 3, 5, 7, 10});
  CHECK(ix.token_expert_indices == std::vector<int32_t>{2, 3, 0, 1, 0, 3, 1, 2, 0, 3});
  CHECK(ix.token_index_map == std::vector<int32_t>{5, 7, 0, 3, 1, 8, 4, 6, 2, 9});
}

// Every invariant of the index arrays (docs/design.md "Index arrays") for one routing.
void check_index_invariants(const std::vector<int32_t>& ids, int64_t T, int K, int E) {
  const auto ix = ref::build_index(ids.data(), T, K, E);
  REQUIRE(ix.expert_token_offsets.size() == size_t(E + 1));
  REQUIRE(ix.expert_token_indices.size() == size_t(T * K));
  REQUIRE(ix.token_index_map.size() == size_t(T * K));
  CHECK(ix.token_expert_indices == ids);
  CHECK(ix.expert_token_offsets.front() == 0);
  CHECK(ix.expert_token_offsets.back() == T * K);
  for (int e = 0; e < E; ++e) {
    const int64_t count = std::count(ids.begin(), ids.end(), e);
    CHECK(ix.expert_token_offsets[e + 1] - ix.expert_token_offsets[e] == count);
    for (int32_t p = ix.expert_token_offsets[e] + 1; p < ix.expert_token_offsets[e + 1]; ++p)
      CHECK(ix.expert_token_indices[p - 1] < ix.expert_token_indices[p]);  // ascending tokens
  }
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      const int32_t pos = ix.token_index_map[t * K + j], e = ids[t * K + j];
      CHECK(ix.expert_token_indices[pos] == t);  // the slot maps back to its token...
      CHECK(pos >= ix.expert_token_offsets[e]);  // ...inside its expert's range
      CHECK(pos < ix.expert_token_offsets[e + 1]);
    }
  std::vector<int32_t> seen(ix.token_index_map);  // token_index_map is a permutation
  std::sort(seen.begin(), seen.end());
  for (int64_t i = 0; i < T * K; ++i) CHECK(seen[i] == i);
}

TEST_CASE("reference: build_index invariants on random routings") {
  std::mt19937_64 rng(11);
  const int shapes[][3] = {{1, 1, 1}, {1, 8, 8}, {7, 4, 2}, {64, 16, 4}, {333, 64, 8}, {1000, 256, 8}, {50, 3, 3}};
  for (const auto& s : shapes) {
    CAPTURE(s[0]);
    CAPTURE(s[1]);
    CAPTURE(s[2]);
    check_index_invariants(random_ids(rng, s[0], s[1], s[2]), s[0], s[2], s[1]);
  }
}

TEST_CASE("reference: build_index edge cases (T=1, empty expert, one expert, T=0)") {
  // T=1 with experts 0 and 3 empty.
  std::vector<int32_t> one{2, 1};
  auto ix = ref::build_index(one.data(), 1, 2, 4);
  CHECK(ix.expert_token_offsets == std::vector<int32_t>{0, 0, 1, 2, 2});
  CHECK(ix.expert_token_indices == std::vector<int32_t>{0, 0});
  CHECK(ix.token_index_map == std::vector<int32_t>{1, 0});
  // K=1, every token on expert 2 of 5: identity order, other experts empty.
  std::vector<int32_t> same(9, 2);
  ix = ref::build_index(same.data(), 9, 1, 5);
  CHECK(ix.expert_token_offsets == std::vector<int32_t>{0, 0, 0, 9, 9, 9});
  for (int t = 0; t < 9; ++t) CHECK(ix.expert_token_indices[t] == t);
  for (int t = 0; t < 9; ++t) CHECK(ix.token_index_map[t] == t);
  check_index_invariants(same, 9, 1, 5);
  // T=0: only the offsets, all zero.
  ix = ref::build_index(nullptr, 0, 2, 3);
  CHECK(ix.expert_token_offsets == std::vector<int32_t>{0, 0, 0, 0});
  CHECK(ix.expert_token_indices.empty());
}

TEST_CASE("reference: build_index rejects out-of-range and duplicate ids") {
  std::vector<int32_t> ids{0, 1, 2, 3, 4, 5, 6, 7};
  ids[3] = 9;
  CHECK(thrown_message([&] { ref::build_index(ids.data(), 4, 2, 8); }) ==
        "topk_ids: id 9 at slot 3 is outside [0, 8)");
  ids[3] = -1;
  CHECK(thrown_message([&] { ref::build_index(ids.data(), 4, 2, 8); }).find("topk_ids: id -1 at slot 3") == 0);
  ids[3] = 3;
  ids[5] = 4;  // token 2 picks 4 twice
  CHECK(thrown_message([&] { ref::build_index(ids.data(), 4, 2, 8); }).find("topk_ids: token 2 picks expert 4 twice") ==
        0);
  CHECK_THROWS_AS(ref::build_index(ids.data(), 4, 0, 8), std::invalid_argument);
}

TEST_CASE("reference: build_index_left_out leaves ids outside [0, E) out of the worked example") {
  // The worked example of docs/design.md with T0's second pick (3) and T2's first (0) bad.
  constexpr int32_t kLeftOutSlot = moeblaze::kLeftOutSlot;
  const int32_t kBad[] = {4, -1, 1 << 30, 2147483647};
  for (int32_t bad : kBad) {
    CAPTURE(bad);
    const std::vector<int32_t> ids{2, bad, 0, 1, bad, 3, 1, 2, 0, 3};
    const auto ix = ref::build_index_left_out(ids.data(), 5, 2, 4);
    // expert 0: T1, T4; expert 1: T1, T3; expert 2: T0, T3; expert 3: T2, T4
    CHECK(ix.expert_token_offsets == std::vector<int32_t>{0, 2, 4, 6, 8});
    CHECK(ix.expert_token_indices == std::vector<int32_t>{1, 4, 1, 3, 0, 3, 2, 4, kLeftOutSlot, kLeftOutSlot});
    CHECK(ix.token_expert_indices == std::vector<int32_t>{2, kLeftOutSlot, 0, 1, kLeftOutSlot, 3, 1, 2, 0, 3});
    CHECK(ix.token_index_map == std::vector<int32_t>{4, kLeftOutSlot, 0, 2, kLeftOutSlot, 6, 3, 5, 1, 7});
  }
  // Without bad ids it is build_index.
  const std::vector<int32_t> good{2, 3, 0, 1, 0, 3, 1, 2, 0, 3};
  const auto a = ref::build_index(good.data(), 5, 2, 4), b = ref::build_index_left_out(good.data(), 5, 2, 4);
  CHECK(a.expert_token_indices == b.expert_token_indices);
  CHECK(a.expert_token_offsets == b.expert_token_offsets);
  CHECK(a.token_expert_indices == b.token_expert_indices);
  CHECK(a.token_index_map == b.token_index_map);
  const std::vector<int32_t> twice{1, 1, 0, 2};
  CHECK(thrown_message([&] { ref::build_index_left_out(twice.data(), 2, 2, 4); }).find("picks expert 1 twice") !=
        std::string::npos);
}

// ---- activations and router --------------------------------------------------------

TEST_CASE("reference: activations match their formulas and derivatives") {
  for (Activation act : kActivations) {
    CAPTURE(int(act));
    for (double a = -6.05; a < 6.0; a += 0.1) {
      CHECK(ref::activation(act, a) == doctest::Approx(local_act(act, a)).epsilon(1e-13));
      const double h = 1e-6, fd = (local_act(act, a + h) - local_act(act, a - h)) / (2 * h);
      CHECK(ref::activation_grad(act, a) == doctest::Approx(fd).epsilon(1e-7));  // FD error ~h^2
    }
  }
  CHECK(ref::activation_grad(Activation::relu, 0.0) == 0.0);
  CHECK(ref::activation(Activation::silu, -800.0) == 0.0);  // no overflow to NaN
}

TEST_CASE("reference: softmax routing picks the K largest and renormalises to route_scale") {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> nd(0.0, 2.0);
  const int T = 40, E = 16, K = 4;
  std::vector<double> logits(T * E);
  for (auto& l : logits) l = nd(rng);
  for (bool renorm : {false, true}) {
    const ref::RouterSpec spec{RouterKind::softmax_topk, renorm, 2.5};
    const auto r = ref::route(spec, logits.data(), T, E, K, nullptr);
    for (int t = 0; t < T; ++t) {
      std::vector<double> p(E);
      double z = 0;
      for (int e = 0; e < E; ++e) z += (p[e] = std::exp(logits[t * E + e]));
      for (auto& v : p) v /= z;
      double picked = 0;
      for (int j = 0; j < K; ++j) picked += p[r.ids[t * K + j]];
      for (int j = 0; j < K; ++j) {
        const int e = r.ids[t * K + j];
        if (j > 0) CHECK(p[r.ids[t * K + j - 1]] > p[e]);  // descending order
        for (int o = 0; o < E; ++o)  // every unpicked expert scores lower
          if (std::find(&r.ids[t * K], &r.ids[t * K] + K, o) == &r.ids[t * K] + K) CHECK(p[o] < p[e]);
        CHECK(r.weights[t * K + j] == doctest::Approx(2.5 * p[e] / (renorm ? picked : 1.0)).epsilon(1e-13));
      }
      if (renorm) CHECK(r.weights[t * K] + r.weights[t * K + 1] + r.weights[t * K + 2] + r.weights[t * K + 3] ==
                        doctest::Approx(2.5).epsilon(1e-14));
    }
    CHECK(ref::gates_for(spec, logits.data(), r.ids.data(), T, E, K) == r.weights);
  }
}

TEST_CASE("reference: sigmoid routing picks by score plus bias but gates with the sigmoid") {
  const std::vector<double> logits{2.0, 1.0, 0.0, -1.0};
  const double s[4] = {1 / (1 + std::exp(-2.0)), 1 / (1 + std::exp(-1.0)), 0.5, 1 / (1 + std::exp(1.0))};
  const float bias[4] = {0.0f, 0.0f, 0.9f, 0.0f};
  ref::RouterSpec spec{RouterKind::sigmoid_topk, false, 1.5};
  auto r = ref::route(spec, logits.data(), 1, 4, 2, nullptr);
  CHECK(r.ids == std::vector<int32_t>{0, 1});
  r = ref::route(spec, logits.data(), 1, 4, 2, bias);  // 0.5 + 0.9 beats 0.88
  CHECK(r.ids == std::vector<int32_t>{2, 0});
  CHECK(r.weights[0] == doctest::Approx(1.5 * s[2]).epsilon(1e-15));  // s, not s + bias
  CHECK(r.weights[1] == doctest::Approx(1.5 * s[0]).epsilon(1e-15));
  spec.renormalize = true;
  r = ref::route(spec, logits.data(), 1, 4, 2, bias);
  CHECK(r.weights[0] == doctest::Approx(1.5 * s[2] / (s[2] + s[0])).epsilon(1e-15));
  CHECK(r.weights[0] + r.weights[1] == doctest::Approx(1.5).epsilon(1e-15));
  // Random: picks are the K largest s + bias; the bias is ignored by softmax routing.
  std::mt19937_64 rng(9);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int T = 30, E = 32, K = 6;
  std::vector<double> l(T * E);
  std::vector<float> b(E);
  for (auto& v : l) v = nd(rng);
  for (auto& v : b) v = float(0.3 * nd(rng));
  r = ref::route(spec, l.data(), T, E, K, b.data());
  for (int t = 0; t < T; ++t) {
    auto score = [&](int e) { return 1 / (1 + std::exp(-l[t * E + e])) + b[e]; };
    const int32_t* picked = &r.ids[t * K];
    for (int j = 1; j < K; ++j) CHECK(score(picked[j - 1]) > score(picked[j]));
    for (int o = 0; o < E; ++o)
      if (std::find(picked, picked + K, o) == picked + K) CHECK(score(o) < score(picked[K - 1]));
  }
  const ref::RouterSpec soft{RouterKind::softmax_topk, false, 1.0};
  CHECK(ref::route(soft, l.data(), T, E, K, b.data()).ids == ref::route(soft, l.data(), T, E, K, nullptr).ids);
}

TEST_CASE("reference: routing ties go to the lower expert id") {
  const std::vector<double> logits{1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
  for (RouterKind kind : {RouterKind::softmax_topk, RouterKind::sigmoid_topk}) {
    const auto r = ref::route({kind, true, 1.0}, logits.data(), 2, 6, 3, nullptr);
    CHECK(r.ids == std::vector<int32_t>{1, 2, 4, 0, 1, 2});
    CHECK(r.weights[0] == doctest::Approx(1.0 / 3).epsilon(1e-15));
  }
  const float bias[6] = {0, 0.25f, 0, 0.25f, 0, 0};  // sigmoid ties created by the bias
  const std::vector<double> flat(6, 0.0);
  CHECK(ref::route({RouterKind::sigmoid_topk, false, 1.0}, flat.data(), 1, 6, 3, bias).ids ==
        std::vector<int32_t>{1, 3, 0});
}

TEST_CASE("reference: router rejects bad input") {
  const std::vector<double> logits(8, 0.1);
  const ref::RouterSpec spec{};
  CHECK_THROWS_AS(ref::route(spec, logits.data(), 2, 4, 5, nullptr), std::invalid_argument);  // K > E
  CHECK_THROWS_AS(ref::route({RouterKind::none, false, 1.0}, logits.data(), 2, 4, 2, nullptr), std::invalid_argument);
  std::vector<double> bad(logits);
  bad[5] = std::nan("");
  CHECK(thrown_message([&] { ref::route(spec, bad.data(), 2, 4, 2, nullptr); }).find("logits:") == 0);
  const std::vector<int32_t> dup{0, 0, 1, 2}, out{0, 1, 4, 2};
  CHECK(thrown_message([&] { ref::gates_for(spec, logits.data(), dup.data(), 2, 4, 2); }).find("ids: token 0") == 0);
  CHECK(thrown_message([&] { ref::gates_for(spec, logits.data(), out.data(), 2, 4, 2); }) ==
        "ids: id 4 at slot 2 is outside [0, 4)");
}

// ---- experts ---------------------------------------------------------------------------

TEST_CASE("reference: forward_rows matches an independent double forward and slot_forward") {
  for (Activation act : kActivations) {
    CAPTURE(int(act));
    const Problem p = make_problem(100 + int(act), 9, 5, 3, 40, 24, act);
    const auto want = local_forward(p, p.gates);
    const auto tokens = all_tokens(p.T);
    CHECK(rel(ref::forward_rows(p.weights(), p.x.data(), p.ids.data(), p.gates.data(), p.K, tokens), want) < 1e-13);
    // A subset, out of order and with a repeat, gives the same rows.
    const std::vector<int64_t> some{7, 2, 7};
    const auto y = ref::forward_rows(p.weights(), p.x.data(), p.ids.data(), p.gates.data(), p.K, some);
    for (size_t i = 0; i < some.size(); ++i)
      CHECK(ref::relative_error(&y[i * p.d], &want[some[i] * p.d], p.d) < 1e-13);
    // slot_forward (plain loops) agrees with the model slot by slot.
    std::vector<double> a, b, h, o;
    local_slot(p, 4, p.ids[4 * p.K + 1], a, b, h, o);
    const auto f = ref::slot_forward(p.weights(), &p.x[4 * p.d], p.ids[4 * p.K + 1]);
    CHECK(rel(f.a, a) < 1e-13);
    CHECK(rel(f.h, h) < 1e-13);
    CHECK(rel(f.o, o) < 1e-13);
    CHECK(f.b.size() == (p.gated() ? size_t(p.n) : 0u));
  }
}

// Finite differences on T=5, E=4, K=2, d=16, n=8, h=1e-5 in double: the central
// difference error is ~1e-10 relative, so 1e-6 leaves a wide margin yet catches any
// wrong term (those are O(1) relative).
TEST_CASE("reference: expert gradients match finite differences") {
  const double tol = 1e-6;
  for (Activation act : kActivations) {
    CAPTURE(int(act));
    // relu has a kink at 0: pick a seed whose pre-activations all stay clear of it.
    Problem p = make_problem(7, 5, 4, 2, 16, 8, act);
    for (uint64_t seed = 8; act == Activation::relu; ++seed) {
      double closest = 1e9;
      std::vector<double> a, b, h, o;
      for (int s = 0; s < p.T * p.K; ++s) {
        local_slot(p, s / p.K, p.ids[s], a, b, h, o);
        for (double v : a) closest = std::min(closest, std::abs(v));
      }
      if (closest > 1e-3) break;
      p = make_problem(seed, 5, 4, 2, 16, 8, act);
    }
    const auto tokens = all_tokens(p.T);
    const auto g = ref::backward_rows(p.weights(), p.x.data(), p.dy.data(), p.ids.data(), p.gates.data(), p.K, tokens);
    const auto wg = all_weight_grads(p);
    auto loss = [&] { return local_loss(p, p.gates); };
    CHECK(rel(g.dx, central_diff(p.xd, loss)) < tol);
    CHECK(rel(g.d_gates, central_diff(p.gates, loss)) < tol);
    CHECK(rel(wg.dw1, central_diff(p.w1d, loss)) < tol);
    CHECK(rel(wg.dw2, central_diff(p.w2d, loss)) < tol);
    if (p.gated()) CHECK(rel(wg.dw3, central_diff(p.w3d, loss)) < tol);
    CHECK(wg.dw3.empty() == !p.gated());
  }
}

// GPT-OSS's experts: the clamped SwiGLU with pre-activations on both sides of its clamps (weights
// scaled up so that |A|, |B| pass 7), and per-expert biases on A, B and o. Every gradient, the
// biases' included, against central differences; seeds whose pre-activations come within 1e-3
// of a clamp (where the difference quotient straddles the kink) are skipped.
TEST_CASE("reference: clamped SwiGLU with expert biases matches finite differences") {
  const double tol = 1e-6;
  Problem p;
  int clamped = 0;
  for (uint64_t seed = 40;; ++seed) {
    p = make_problem(seed, 6, 4, 2, 16, 8, Activation::clamped_swiglu);
    for (auto* w : {&p.w1d, &p.w3d})
      for (double& v : *w) v *= 6.0;  // exact in double; the bf16 copies are not used below
    p.add_biases(seed + 1000, 2.0);
    for (size_t i = 0; i < p.w1.size(); ++i) {
      p.w1[i] = moeblaze::to_bf16(float(p.w1d[i]));
      p.w3[i] = moeblaze::to_bf16(float(p.w3d[i]));
      p.w1d[i] = moeblaze::to_float(p.w1[i]);
      p.w3d[i] = moeblaze::to_float(p.w3[i]);
    }
    double closest = 1e9;
    clamped = 0;
    std::vector<double> a, b, h, o;
    for (int s = 0; s < p.T * p.K; ++s) {
      local_slot(p, s / p.K, p.ids[s], a, b, h, o);
      for (double v : a) closest = std::min(closest, std::abs(v - 7.0)), clamped += v > 7.0;
      for (double v : b) closest = std::min({closest, std::abs(v - 7.0), std::abs(v + 7.0)}), clamped += std::abs(v) > 7;
    }
    if (closest > 1e-3 && clamped > 0) break;
  }
  CAPTURE(clamped);
  const auto tokens = all_tokens(p.T);
  const auto y = ref::forward_rows(p.weights(), p.x.data(), p.ids.data(), p.gates.data(), p.K, tokens);
  CHECK(rel(y, local_forward(p, p.gates)) < 1e-13);
  const auto g = ref::backward_rows(p.weights(), p.x.data(), p.dy.data(), p.ids.data(), p.gates.data(), p.K, tokens);
  const auto wg = all_weight_grads(p);
  auto loss = [&] { return local_loss(p, p.gates); };
  CHECK(rel(g.dx, central_diff(p.xd, loss)) < tol);
  CHECK(rel(g.d_gates, central_diff(p.gates, loss)) < tol);
  CHECK(rel(wg.dw1, central_diff(p.w1d, loss)) < tol);
  CHECK(rel(wg.dw3, central_diff(p.w3d, loss)) < tol);
  CHECK(rel(wg.dw2, central_diff(p.w2d, loss)) < tol);
  CHECK(rel(wg.d_bias_up, central_diff(p.bud, loss)) < tol);
  CHECK(rel(wg.d_bias_down, central_diff(p.bdd, loss)) < tol);
  // The sampled-rows variant agrees with the full gradients, the biases' too.
  const std::vector<int> rows{0, 3, 7};
  for (int e = 0; e < p.E; ++e) {
    const auto full = ref::expert_weight_grads(p.weights(), p.x.data(), p.dy.data(), p.ids.data(), p.gates.data(),
                                               p.T, p.K, e);
    const auto part = ref::expert_weight_grad_rows(p.weights(), p.x.data(), p.dy.data(), p.ids.data(),
                                                   p.gates.data(), p.T, p.K, e, rows);
    for (size_t r = 0; r < rows.size(); ++r) {
      CHECK(part.d_bias_up[r] == doctest::Approx(full.d_bias_up[rows[r]]).epsilon(1e-12));
      CHECK(part.d_bias_up[rows.size() + r] == doctest::Approx(full.d_bias_up[p.n + rows[r]]).epsilon(1e-12));
    }
    CHECK(rel(part.d_bias_down, full.d_bias_down) < 1e-13);
  }
}

// Full router path: x, W_r -> logits -> gates (selection held fixed) -> y. dx of the
// layer is the expert part (backward_rows) plus the router part (router_dx_rows).
TEST_CASE("reference: router gradients match finite differences") {
  const double tol = 1e-6;
  int variant = 0;
  for (RouterKind kind : {RouterKind::softmax_topk, RouterKind::sigmoid_topk})
    for (bool renorm : {false, true}) {
      const ref::RouterSpec spec{kind, renorm, renorm ? 2.5 : 1.0};
      CAPTURE(int(kind));
      CAPTURE(renorm);
      Problem p = make_problem(40 + variant++, 5, 4, 2, 16, 8, Activation::swiglu);
      const auto logits = ref::router_logits(p.x.data(), p.wr.data(), p.T, p.d, p.E);
      CHECK(rel(logits, local_logits(p)) < 1e-14);
      const float bias[4] = {0.3f, -0.2f, 0.1f, 0.0f};
      const auto r = ref::route(spec, logits.data(), p.T, p.E, p.K, bias);
      p.ids = r.ids;
      p.gates = ref::gates_for(spec, logits.data(), p.ids.data(), p.T, p.E, p.K);
      CHECK(p.gates == r.weights);
      CHECK(rel(p.gates, local_gates(spec, logits, p.ids, p.T, p.E, p.K)) < 1e-14);

      const auto tokens = all_tokens(p.T);
      const auto g = ref::backward_rows(p.weights(), p.x.data(), p.dy.data(), p.ids.data(), p.gates.data(), p.K, tokens);
      const auto dlogits = ref::router_logits_grad(spec, logits.data(), p.ids.data(), g.d_gates.data(), p.T, p.E, p.K);
      // d logits alone: L as a function of the logits, experts fixed.
      std::vector<double> l(logits);
      auto loss_of_logits = [&] { return local_loss(p, local_gates(spec, l, p.ids, p.T, p.E, p.K)); };
      CHECK(rel(dlogits, central_diff(l, loss_of_logits)) < tol);
      if (kind == RouterKind::sigmoid_topk)  // only picked logits get gradient
        for (int t = 0; t < p.T; ++t)
          for (int e = 0; e < p.E; ++e)
            if (std::find(&p.ids[t * p.K], &p.ids[t * p.K] + p.K, e) == &p.ids[t * p.K] + p.K)
              CHECK(dlogits[t * p.E + e] == 0.0);
      // Through x and W_r.
      auto loss = [&] { return local_loss(p, local_gates(spec, local_logits(p), p.ids, p.T, p.E, p.K)); };
      std::vector<double> dx = ref::router_dx_rows(dlogits.data(), p.wr.data(), p.E, p.d, tokens);
      for (size_t i = 0; i < dx.size(); ++i) dx[i] += g.dx[i];
      CHECK(rel(dx, central_diff(p.xd, loss)) < tol);
      CHECK(rel(ref::router_weight_grad(dlogits.data(), p.x.data(), p.T, p.E, p.d), central_diff(p.wrd, loss)) < tol);
    }
}

// Plain-loop backward of the double model (formulas of reference.hpp), to check the
// blocked kernels on shapes whose sizes cross their chunk and tile boundaries.
ref::ExpertGrads local_backward(const Problem& p, std::vector<double>& dx, std::vector<double>& dg) {
  ref::ExpertGrads w;
  w.dw1.assign(size_t(p.E) * p.n * p.d, 0.0), w.dw3.assign(size_t(p.E) * p.n * p.d, 0.0);
  w.dw2.assign(size_t(p.E) * p.d * p.n, 0.0);
  dx.assign(size_t(p.T) * p.d, 0.0), dg.assign(size_t(p.T) * p.K, 0.0);
  std::vector<double> a, b, h, o, da(p.n), db(p.n);
  for (int t = 0; t < p.T; ++t)
    for (int j = 0; j < p.K; ++j) {
      const int e = p.ids[t * p.K + j];
      const double gate = p.gates[t * p.K + j];
      const double* dy = &p.dyd[size_t(t) * p.d];
      local_slot(p, t, e, a, b, h, o);
      for (int c = 0; c < p.d; ++c) dg[t * p.K + j] += dy[c] * o[c];
      for (int i = 0; i < p.n; ++i) {
        double dh = 0;
        for (int c = 0; c < p.d; ++c) dh += dy[c] * p.w2d[(size_t(e) * p.d + c) * p.n + i];
        dh *= gate;
        da[i] = dh * (p.gated() ? b[i] : 1.0) * ref::activation_grad(p.act, a[i]);
        db[i] = dh * local_act(p.act, a[i]);
      }
      for (int i = 0; i < p.n; ++i)
        for (int c = 0; c < p.d; ++c) {
          const size_t wi = (size_t(e) * p.n + i) * p.d + c;
          dx[size_t(t) * p.d + c] += da[i] * p.w1d[wi] + (p.gated() ? db[i] * p.w3d[wi] : 0.0);
          w.dw1[wi] += da[i] * p.xd[size_t(t) * p.d + c];
          w.dw3[wi] += db[i] * p.xd[size_t(t) * p.d + c];
          w.dw2[(size_t(e) * p.d + c) * p.n + i] += gate * dy[c] * h[i];
        }
    }
  if (!p.gated()) w.dw3.clear();
  return w;
}

TEST_CASE("reference: blocked kernels match plain loops on uneven medium shapes") {
  // d=600 spans three 256-column and two 512-column chunks, n=70 a partial 64-row chunk;
  // ~27 slots per expert exercise the slot tails of every micro-kernel.
  for (Activation act : {Activation::swiglu, Activation::gelu}) {
    CAPTURE(int(act));
    const Problem p = make_problem(77, 40, 3, 2, 600, 70, act);
    const auto tokens = all_tokens(p.T);
    std::vector<double> dx, dg;
    const auto want = local_backward(p, dx, dg);
    CHECK(rel(ref::forward_rows(p.weights(), p.x.data(), p.ids.data(), p.gates.data(), p.K, tokens),
              local_forward(p, p.gates)) < 1e-13);
    const auto g = ref::backward_rows(p.weights(), p.x.data(), p.dy.data(), p.ids.data(), p.gates.data(), p.K, tokens);
    CHECK(rel(g.dx, dx) < 1e-13);
    CHECK(rel(g.d_gates, dg) < 1e-13);
    const auto got = all_weight_grads(p);
    CHECK(rel(got.dw1, want.dw1) < 1e-13);
    CHECK(rel(got.dw2, want.dw2) < 1e-13);
    CHECK(rel(got.dw3, want.dw3) < 1e-13);
  }
  // Router kernels on T=100, E=12, d=600 against plain loops.
  const Problem p = make_problem(78, 100, 12, 2, 600, 8, Activation::silu);
  const auto logits = ref::router_logits(p.x.data(), p.wr.data(), p.T, p.d, p.E);
  CHECK(rel(logits, local_logits(p)) < 1e-13);
  std::vector<double> dl(logits.size());
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto& v : dl) v = u(rng);
  std::vector<double> dwr(size_t(p.E) * p.d, 0.0), dxr(size_t(p.T) * p.d, 0.0);
  for (int t = 0; t < p.T; ++t)
    for (int e = 0; e < p.E; ++e)
      for (int c = 0; c < p.d; ++c) {
        dwr[size_t(e) * p.d + c] += dl[size_t(t) * p.E + e] * p.xd[size_t(t) * p.d + c];
        dxr[size_t(t) * p.d + c] += dl[size_t(t) * p.E + e] * p.wrd[size_t(e) * p.d + c];
      }
  CHECK(rel(ref::router_weight_grad(dl.data(), p.x.data(), p.T, p.E, p.d), dwr) < 1e-13);
  CHECK(rel(ref::router_dx_rows(dl.data(), p.wr.data(), p.E, p.d, all_tokens(p.T)), dxr) < 1e-13);
}

TEST_CASE("reference: expert functions reject bad input and accept empty requests") {
  Problem p = make_problem(1, 4, 4, 2, 8, 8, Activation::swiglu);
  auto w = p.weights();
  const auto tokens = all_tokens(p.T);
  p.ids[5] = 4;
  CHECK(thrown_message([&] { ref::forward_rows(w, p.x.data(), p.ids.data(), p.gates.data(), p.K, tokens); }) ==
        "ids: id 4 at slot 5 is outside [0, 4)");
  CHECK_THROWS_AS(ref::expert_weight_grads(w, p.x.data(), p.dy.data(), p.ids.data(), p.gates.data(), p.T, p.K, 0),
                  std::invalid_argument);
  p.ids[5] = 1;
  CHECK_THROWS_AS(ref::slot_forward(w, p.x.data(), 4), std::invalid_argument);
  // Empty requests: an expert with no slots has zero (not missing) gradients.
  p.ids = {0, 1, 1, 2, 2, 0, 0, 1};  // expert 3 unused
  const auto none = ref::expert_weight_grads(w, p.x.data(), p.dy.data(), p.ids.data(), p.gates.data(), p.T, p.K, 3);
  CHECK(none.dw1 == std::vector<double>(size_t(p.n) * p.d, 0.0));
  CHECK(none.dw3 == std::vector<double>(size_t(p.n) * p.d, 0.0));
  CHECK(none.dw2 == std::vector<double>(size_t(p.d) * p.n, 0.0));
  CHECK(ref::forward_rows(w, p.x.data(), p.ids.data(), p.gates.data(), p.K, {}).empty());
  w.w3 = nullptr;  // gated activation without W3
  CHECK(thrown_message([&] { ref::forward_rows(w, p.x.data(), p.ids.data(), p.gates.data(), p.K, tokens); })
            .find("w3") != std::string::npos);
}

TEST_CASE("reference: relative_error") {
  const std::vector<double> ref_v{3.0, 4.0}, same{3.0, 4.0}, off{3.0, 4.5}, zero{0.0, 0.0};
  CHECK(ref::relative_error(same.data(), ref_v.data(), 2) == 0.0);
  CHECK(ref::relative_error(off.data(), ref_v.data(), 2) == doctest::Approx(0.1));
  CHECK(ref::relative_error(zero.data(), zero.data(), 2) == 0.0);
  CHECK(std::isinf(ref::relative_error(off.data(), zero.data(), 2)));
  const std::vector<double> nan_v{3.0, std::nan("")}, inf_v{3.0, INFINITY};
  CHECK(std::isinf(ref::relative_error(nan_v.data(), ref_v.data(), 2)));
  CHECK(std::isinf(ref::relative_error(inf_v.data(), ref_v.data(), 2)));
}

TEST_SUITE_END();
