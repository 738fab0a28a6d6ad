// CPU reference of the MoE layer: see reference.hpp for the contract and docs/design.md
// ("The layer", "Kernels") for the math. Everything is computed in double from bf16 inputs.
//
// Speed matters because GPU checks call this on real model shapes (d=7168, n=2048, K=8,
// hundreds of tokens). The expert functions therefore group the requested slots by expert
// and run three small blocked kernels over each expert's weights, so that a weight row is
// converted from bf16 once and then used for every slot routed to that expert:
//   NT  out[r,s] = <W[r,:], v_s>            up- and down-projection (x W1^T, h W2^T)
//   NN  out_s   += sum_r coef_s[r] W[r,:]   dgrads (dy W2, dA W1 + dB W3)
//   TN  G[r,c]  += sum_s p_s[r] q_s[c]      weight grads (dA^T x, (g dy)^T h)
// Work is split into (job, chunk) tasks run by the worker pool (core/parallel.hpp). Each output element
// is summed by one task in an order fixed by the shapes alone, so results do not depend
// on the number of threads.
#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/parallel.hpp"

namespace moeblaze::reference {
namespace {

// ---- errors ----------------------------------------------------------------

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

void require(bool ok, const char* message) {
  if (!ok) fail(message);
}

void check_id(const char* name, int64_t id, int64_t slot, int E) {
  if (id < 0 || id >= E)
    fail(std::string(name) + ": id " + std::to_string(id) + " at slot " + std::to_string(slot) +
         " is outside [0, " + std::to_string(E) + ")");
}

void check_expert(int expert, int E) {
  if (expert < 0 || expert >= E)
    fail("expert: " + std::to_string(expert) + " is outside [0, " + std::to_string(E) + ")");
}

void check_token(int64_t token, size_t index) {
  if (token < 0)
    fail("tokens: token " + std::to_string(token) + " at index " + std::to_string(index) +
         " is negative");
}

// Runs every chunk of every job in one parallel region, so that many small jobs (one per
// expert) still keep every thread busy. Job has chunks() and run(chunk).
template <class Job>
void run_jobs(const std::vector<Job>& jobs) {
  std::vector<int64_t> first(jobs.size() + 1, 0);
  for (size_t j = 0; j < jobs.size(); ++j) first[j + 1] = first[j] + jobs[j].chunks();
  parallel_tasks(first.back(), [&](int64_t task) {
    const size_t j = std::upper_bound(first.begin(), first.end(), task) - first.begin() - 1;
    jobs[j].run(task - first[j]);
  });
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scratch that lives as long as the worker thread (workers live for one call).
double* scratch(size_t count) {
  thread_local std::vector<double> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// Pointers to the rows of a dense [rows, len] matrix held in v (empty when v is).
template <class V>
auto row_ptrs(V& v, int64_t len) {
  std::vector<decltype(v.data())> rows(v.size() / len);
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = v.data() + r * len;
  return rows;
}

// ---- micro-kernels ----------------------------------------------------------------------

// Two doubles: native on x86-64 (SSE2) and aarch64 (NEON). Wider generic vectors are
// lowered through the stack when the target lacks them, which is slower than this.
typedef double v2d __attribute__((vector_size(16)));

void to_double(const bf16* in, int64_t count, double* out) {
  for (int64_t k = 0; k < count; ++k) out[k] = to_float(in[k]);
}

// out[q] = <a[q], b> for q < 4: four rows share each load of b; two accumulators per
// row hide the add latency.
void dot4(const double* const a[4], const double* b, int64_t len, double out[4]) {
  const v2d zero = {0, 0};
  v2d s00 = zero, s01 = zero, s10 = zero, s11 = zero, s20 = zero, s21 = zero, s30 = zero,
      s31 = zero;
  int64_t k = 0;
  for (; k + 4 <= len; k += 4) {
    v2d x0, x1, w0, w1, w2, w3, w4, w5, w6, w7;  // memcpy: unaligned loads
    std::memcpy(&x0, b + k, 16), std::memcpy(&x1, b + k + 2, 16);
    std::memcpy(&w0, a[0] + k, 16), std::memcpy(&w1, a[0] + k + 2, 16);
    std::memcpy(&w2, a[1] + k, 16), std::memcpy(&w3, a[1] + k + 2, 16);
    std::memcpy(&w4, a[2] + k, 16), std::memcpy(&w5, a[2] + k + 2, 16);
    std::memcpy(&w6, a[3] + k, 16), std::memcpy(&w7, a[3] + k + 2, 16);
    s00 += w0 * x0, s01 += w1 * x1, s10 += w2 * x0, s11 += w3 * x1;
    s20 += w4 * x0, s21 += w5 * x1, s30 += w6 * x0, s31 += w7 * x1;
  }
  // (No pointers to the accumulators: that would keep them in memory, not registers.)
  out[0] = (s00[0] + s01[0]) + (s00[1] + s01[1]);
  out[1] = (s10[0] + s11[0]) + (s10[1] + s11[1]);
  out[2] = (s20[0] + s21[0]) + (s20[1] + s21[1]);
  out[3] = (s30[0] + s31[0]) + (s30[1] + s31[1]);
  for (int q = 0; q < 4; ++q)
    for (int64_t t = k; t < len; ++t) out[q] += a[q][t] * b[t];
}

// y += c[0] a[0] + ... + c[m-1] a[m-1], m <= 4 (auto-vectorised).
void axpy_rows(int m, const double* c, const double* const a[4], double* y, int64_t len) {
  if (m == 4) {
    const double c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    for (int64_t k = 0; k < len; ++k)
      y[k] += (c0 * a[0][k] + c1 * a[1][k]) + (c2 * a[2][k] + c3 * a[3][k]);
    return;
  }
  for (int q = 0; q < m; ++q)
    for (int64_t k = 0; k < len; ++k) y[k] += c[q] * a[q][k];
}

// ---- blocked kernels ----------------------------------------------------------------------

// out[r*out_r + s*out_s] = <W[r,:], v[s]> for r < rows, s < S; W bf16 [rows, len]. A task
// converts a chunk of W rows once, then sweeps the vectors block by block.
struct NtJob {
  const bf16* w;
  int64_t rows, len;
  const double* const* v;
  int64_t S;
  double* out;
  int64_t out_r, out_s;

  int64_t chunk_rows() const { return std::clamp<int64_t>(65536 / len / 4 * 4, 4, 64); }
  int64_t chunks() const { return ceil_div(rows, chunk_rows()); }
  void run(int64_t chunk) const {
    const int64_t r0 = chunk * chunk_rows(), m = std::min(chunk_rows(), rows - r0);
    double* wr = scratch(m * len);
    for (int64_t r = 0; r < m; ++r) to_double(w + (r0 + r) * len, len, wr + r * len);
    const int64_t vblock = std::clamp<int64_t>(65536 / len, 1, 64);  // vectors kept in cache
    for (int64_t s0 = 0; s0 < S; s0 += vblock) {
      for (int64_t rt = 0; rt < m; rt += 4) {
        const int count = static_cast<int>(std::min<int64_t>(4, m - rt));
        const double* a[4];  // short tiles repeat their last row; the extra dots are dropped
        for (int q = 0; q < 4; ++q) a[q] = wr + (rt + std::min(q, count - 1)) * len;
        for (int64_t s = s0; s < std::min(S, s0 + vblock); ++s) {
          double d4[4];
          dot4(a, v[s], len, d4);
          for (int q = 0; q < count; ++q) out[(r0 + rt + q) * out_r + s * out_s] = d4[q];
        }
      }
    }
  }
};

// out[s][c] += sum over terms of sum_r coef[s][r] W[r,c]; W bf16 [rows, cols]. Tasks own
// column chunks and sum the rows in order (deterministic, no atomics).
struct NnJob {
  int terms;
  const bf16* w[2];
  const double* const* coef[2];
  int64_t rows, cols, S;
  double* const* out;

  static constexpr int64_t chunk_cols = 256;
  int64_t chunks() const { return ceil_div(cols, chunk_cols); }
  void run(int64_t chunk) const {
    const int64_t c0 = chunk * chunk_cols, width = std::min(chunk_cols, cols - c0);
    double* seg = scratch(4 * width);
    for (int term = 0; term < terms; ++term) {
      for (int64_t r0 = 0; r0 < rows; r0 += 4) {
        const int m = static_cast<int>(std::min<int64_t>(4, rows - r0));
        const double* a[4] = {seg, seg, seg, seg};
        for (int q = 0; q < m; ++q) {
          a[q] = seg + q * width;
          to_double(w[term] + (r0 + q) * cols + c0, width, seg + q * width);
        }
        for (int64_t s = 0; s < S; ++s) axpy_rows(m, coef[term][s] + r0, a, out[s] + c0, width);
      }
    }
  }
};

// G[r*cols + c] += sum_s p[s][r] q[s][c]. Tasks own 8-row x 512-column tiles of G.
struct TnJob {
  double* g;
  int64_t rows, cols;
  const double* const* p;
  const double* const* q;
  int64_t S;

  static constexpr int64_t tile_rows = 8, tile_cols = 512;
  int64_t chunks() const { return ceil_div(rows, tile_rows) * ceil_div(cols, tile_cols); }
  void run(int64_t chunk) const {
    const int64_t col_tiles = ceil_div(cols, tile_cols);
    const int64_t r0 = chunk / col_tiles * tile_rows, c0 = chunk % col_tiles * tile_cols;
    const int64_t width = std::min(tile_cols, cols - c0);
    for (int64_t s0 = 0; s0 < S; s0 += 4) {
      const int m = static_cast<int>(std::min<int64_t>(4, S - s0));
      const double* a[4];
      for (int k = 0; k < 4; ++k) a[k] = q[s0 + std::min(k, m - 1)] + c0;
      for (int64_t r = r0; r < std::min(rows, r0 + tile_rows); ++r) {
        double c[4];
        for (int k = 0; k < m; ++k) c[k] = p[s0 + k][r];
        axpy_rows(m, c, a, g + r * cols + c0, width);
      }
    }
  }
};

// ---- expert passes over slots grouped by expert -------------------------------------------

void check_weights(const ExpertWeights& w) {
  require(w.E > 0 && w.d > 0 && w.n > 0, "ExpertWeights: E, d and n must be positive");
  require(w.w1 != nullptr, "ExpertWeights: w1 is null");
  require(w.w2 != nullptr, "ExpertWeights: w2 is null");
  require(!is_gated(w.act) || w.w3 != nullptr, "ExpertWeights: w3 is null for a gated activation");
  require(int(w.act) >= 0 && int(w.act) <= 5, "ExpertWeights: act is not an Activation");
  require((w.b_up == nullptr) == (w.b_down == nullptr), "ExpertWeights: give both biases or neither");
}

void check_request(const ExpertWeights& w, const bf16* x, const int32_t* ids, const double* gates,
                   int K) {
  check_weights(w);
  require(K >= 1, "K: must be at least 1");
  require(x != nullptr, "x: is null");
  require(ids != nullptr, "ids: is null");
  require(gates != nullptr, "gates: is null");
}

// Slots sorted by expert (stable). Row pointers refer to caller-owned double rows.
struct SlotSet {
  std::vector<int> experts;          // active experts, ascending
  std::vector<int64_t> begin;        // experts.size()+1 offsets into the sorted slots
  std::vector<const double*> x, dy;  // per sorted slot: its token's x and dy rows (length d)
  std::vector<double> gate;          // per sorted slot
  int64_t size() const { return begin.back(); }
};

// Sorts the slots (request row i, pick j) by expert; returns the sorted position of
// slot i*K+j. xrows/dyrows hold the request rows as doubles (dyrows may be null).
std::vector<int64_t> group_slots(const int32_t* ids, const double* gates, int K,
                                 const std::vector<int64_t>& tokens, int E, const double* xrows,
                                 const double* dyrows, int64_t d, SlotSet& set) {
  std::vector<int64_t> start(E + 1, 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    check_token(tokens[i], i);
    for (int j = 0; j < K; ++j) {
      check_id("ids", ids[tokens[i] * K + j], tokens[i] * K + j, E);
      ++start[ids[tokens[i] * K + j] + 1];
    }
  }
  for (int e = 0; e < E; ++e) start[e + 1] += start[e];
  const int64_t count = int64_t(tokens.size()) * K;
  std::vector<int64_t> position(count), cursor(start.begin(), start.end() - 1);
  set.x.assign(count, nullptr);
  set.dy.assign(count, nullptr);
  set.gate.assign(count, 0.0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int j = 0; j < K; ++j) {
      const int64_t slot = tokens[i] * K + j, p = cursor[ids[slot]]++;
      position[i * K + j] = p;
      set.x[p] = xrows + i * d;
      set.dy[p] = dyrows ? dyrows + i * d : nullptr;
      set.gate[p] = gates[slot];
    }
  }
  set.experts.clear();
  set.begin.assign(1, 0);
  for (int e = 0; e < E; ++e) {
    if (start[e + 1] == start[e]) continue;
    set.experts.push_back(e);
    set.begin.push_back(start[e + 1]);
  }
  return position;
}

// The listed bf16 rows [., d] as a dense double matrix [rows.size(), d].
std::vector<double> gather_rows(const bf16* src, const std::vector<int64_t>& rows, int64_t d) {
  std::vector<double> out(rows.size() * d);
  parallel_tasks(int64_t(rows.size()),
               [&](int64_t i) { to_double(src + rows[i] * d, d, out.data() + i * d); });
  return out;
}

// out rows of each expert's slots = v rows times W_e^T, W = [E, rows, len].
void nt_pass(const SlotSet& set, const bf16* w, int64_t rows, int64_t len,
             const std::vector<const double*>& v, double* out) {
  std::vector<NtJob> jobs;
  for (size_t k = 0; k < set.experts.size(); ++k) {
    const int64_t b0 = set.begin[k];
    jobs.push_back({w + set.experts[k] * rows * len, rows, len, v.data() + b0,
                    set.begin[k + 1] - b0, out + b0 * rows, 1, rows});
  }
  run_jobs(jobs);
}

// out_s += ca_s Wa_e (+ cb_s Wb_e when wb) for every slot s of expert e, W = [E, rows, cols].
void nn_pass(const SlotSet& set, int64_t rows, int64_t cols, const bf16* wa,
             const std::vector<const double*>& ca, const bf16* wb,
             const std::vector<const double*>& cb, const std::vector<double*>& out) {
  std::vector<NnJob> jobs;
  for (size_t k = 0; k < set.experts.size(); ++k) {
    const int64_t b0 = set.begin[k], e = set.experts[k] * rows * cols;
    jobs.push_back({wb ? 2 : 1, {wa + e, wb ? wb + e : nullptr},
                    {ca.data() + b0, wb ? cb.data() + b0 : nullptr}, rows, cols,
                    set.begin[k + 1] - b0, out.data() + b0});
  }
  run_jobs(jobs);
}

struct UpResult {
  std::vector<double> a, b, h;  // [S, n] each (b empty when not gated)
};

// A = x W1^T, B = x W3^T, h = act(A) (* B) for every slot of the set.
UpResult up_pass(const ExpertWeights& w, const SlotSet& set) {
  const int64_t S = set.size(), n = w.n;
  const bool gated = is_gated(w.act);
  UpResult r;
  r.a.assign(S * n, 0.0);
  nt_pass(set, w.w1, n, w.d, set.x, r.a.data());
  if (gated) {
    r.b.assign(S * n, 0.0);
    nt_pass(set, w.w3, n, w.d, set.x, r.b.data());
  }
  if (w.b_up) {  // [gate | up] biases of each slot's expert
    const int64_t gn = (gated ? 2 : 1) * n;
    for (size_t k = 0; k < set.experts.size(); ++k)
      for (int64_t s = set.begin[k]; s < set.begin[k + 1]; ++s)
        for (int64_t i = 0; i < n; ++i) {
          r.a[s * n + i] += to_float(w.b_up[set.experts[k] * gn + i]);
          if (gated) r.b[s * n + i] += to_float(w.b_up[set.experts[k] * gn + n + i]);
        }
  }
  r.h.resize(S * n);
  parallel_tasks(S, [&](int64_t s) {
    for (int64_t i = s * n; i < (s + 1) * n; ++i)
      r.h[i] = activation(w.act, r.a[i]) * (gated ? up_factor(w.act, r.b[i]) : 1.0);
  });
  return r;
}

struct BackResult {
  UpResult up;
  std::vector<double> dg;      // [S] dL/dg per slot
  std::vector<double> da, db;  // [S, n] (db empty when not gated)
};

// Backward up to dA, dB: recomputed A, B, h, then u = dy W2, dg = <u, h> (+ <dy, b_down>: = <dy, o>),
// dh = g u, dA = dh up(B) act'(A) (plain: dh act'(A)), dB = dh act(A) up'(B).
BackResult back_pass(const ExpertWeights& w, const SlotSet& set) {
  const int64_t S = set.size(), n = w.n;
  const bool gated = is_gated(w.act);
  BackResult r;
  r.up = up_pass(w, set);
  std::vector<double> u(S * n, 0.0);
  nn_pass(set, w.d, n, w.w2, set.dy, nullptr, {}, row_ptrs(u, n));
  r.dg.assign(S, 0.0);
  r.da.assign(S * n, 0.0);
  if (gated) r.db.assign(S * n, 0.0);
  parallel_tasks(S, [&](int64_t s) {
    for (int64_t i = s * n; i < (s + 1) * n; ++i) r.dg[s] += u[i] * r.up.h[i];
    for (int64_t i = s * n; i < (s + 1) * n; ++i) {
      const double dh = set.gate[s] * u[i], a = r.up.a[i];
      r.da[i] = dh * (gated ? up_factor(w.act, r.up.b[i]) : 1.0) * activation_grad(w.act, a);
      if (gated) r.db[i] = dh * activation(w.act, a) * up_factor_grad(w.act, r.up.b[i]);
    }
  });
  if (w.b_down)
    for (size_t k = 0; k < set.experts.size(); ++k)
      for (int64_t s = set.begin[k]; s < set.begin[k + 1]; ++s)
        for (int64_t c = 0; c < w.d; ++c) r.dg[s] += set.dy[s][c] * to_float(w.b_down[set.experts[k] * w.d + c]);
  return r;
}

// ---- router helpers ---------------------------------------------------------------------

double sigmoid(double a) {
  if (a >= 0) return 1.0 / (1.0 + std::exp(-a));
  const double z = std::exp(a);
  return z / (1.0 + z);
}

void check_router(const RouterSpec& spec, const double* logits, int64_t T, int E, int K) {
  require(spec.kind == RouterKind::softmax_topk || spec.kind == RouterKind::sigmoid_topk,
          "spec.kind: only softmax_topk and sigmoid_topk are built-in routers");
  require(T >= 0, "T: must not be negative");
  require(E >= 1, "E: must be at least 1");
  if (K < 1 || K > E)
    fail("K: " + std::to_string(K) + " is outside [1, E=" + std::to_string(E) + "]");
  require(logits != nullptr || T == 0, "logits: is null");
}

// Validates the K ids of every token (range, duplicates); `name` is the argument's name.
void check_ids(const char* name, const int32_t* ids, int64_t T, int K, int E) {
  require(ids != nullptr || T == 0, (std::string(name) + ": is null").c_str());
  for (int64_t slot = 0; slot < T * K; ++slot) {
    check_id(name, ids[slot], slot, E);
    for (int64_t other = slot / K * K; other < slot; ++other)
      if (ids[other] == ids[slot])
        fail(std::string(name) + ": token " + std::to_string(slot / K) + " picks expert " +
             std::to_string(ids[slot]) + " twice (slots " + std::to_string(other) + " and " +
             std::to_string(slot) + ")");
  }
}

// p (softmax) or s (sigmoid) of one token's logits row.
void token_probs(const RouterSpec& spec, const double* l, int64_t t, int E, double* p) {
  for (int e = 0; e < E; ++e)
    if (!std::isfinite(l[e]))
      fail("logits: value at token " + std::to_string(t) + ", expert " + std::to_string(e) +
           " is not finite");
  if (spec.kind == RouterKind::sigmoid_topk) {
    for (int e = 0; e < E; ++e) p[e] = sigmoid(l[e]);
    return;
  }
  const double m = *std::max_element(l, l + E);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - m));
  for (int e = 0; e < E; ++e) p[e] /= sum;
}

// The K gates of one token from its probabilities and picked ids.
void token_gates(const RouterSpec& spec, const double* p, const int32_t* picked, int K, double* g) {
  double total = 0;
  for (int j = 0; j < K; ++j) total += p[picked[j]];
  for (int j = 0; j < K; ++j)
    g[j] = p[picked[j]] / (spec.renormalize ? total : 1.0) * spec.route_scale;
}

// Runs body(t, p) for every token in parallel, p = that token's probabilities.
template <class F>
void for_each_token(const RouterSpec& spec, const double* logits, int64_t T, int E, F&& body) {
  constexpr int64_t block = 64;
  parallel_tasks(ceil_div(T, block), [&](int64_t b) {
    std::vector<double> p(E);
    for (int64_t t = b * block; t < std::min(T, (b + 1) * block); ++t) {
      token_probs(spec, logits + t * E, t, E, p.data());
      body(t, p);
    }
  });
}

}  // namespace

// ---- activations --------------------------------------------------------------------------

const double gelu_c = std::sqrt(2.0 / std::numbers::pi);  // gelu is the tanh approximation
// GPT-OSS's constants in double (the device's floats are these, rounded).
constexpr double clamp_alpha = 1.702, clamp_limit = 7.0;
static_assert(float(clamp_alpha) == kClampedSwigluAlpha && float(clamp_limit) == kClampedSwigluLimit);

double activation(Activation act, double a) {
  switch (act) {
    case Activation::swiglu:
    case Activation::silu: return a * sigmoid(a);
    case Activation::geglu:
    case Activation::gelu: return 0.5 * a * (1.0 + std::tanh(gelu_c * (a + 0.044715 * a * a * a)));
    case Activation::relu: return a > 0 ? a : 0.0;
    case Activation::clamped_swiglu: {
      const double m = std::min(a, clamp_limit);
      return m * sigmoid(clamp_alpha * m);
    }
  }
  fail("act: not an Activation value");
}

double up_factor(Activation act, double b) {
  if (act != Activation::clamped_swiglu) return b;
  return std::clamp(b, -clamp_limit, clamp_limit) + 1.0;
}

double up_factor_grad(Activation act, double b) {
  if (act != Activation::clamped_swiglu) return 1.0;
  return b >= -clamp_limit && b <= clamp_limit ? 1.0 : 0.0;
}

double activation_grad(Activation act, double a) {
  switch (act) {
    case Activation::swiglu:
    case Activation::silu: {
      const double s = sigmoid(a);
      return s * (1.0 + a * (1.0 - s));
    }
    case Activation::geglu:
    case Activation::gelu: {
      const double th = std::tanh(gelu_c * (a + 0.044715 * a * a * a));
      return 0.5 * (1.0 + th) + 0.5 * a * (1.0 - th * th) * gelu_c * (1.0 + 3 * 0.044715 * a * a);
    }
    case Activation::relu: return a > 0 ? 1.0 : 0.0;  // relu'(0) = 0
    case Activation::clamped_swiglu: {  // min(a, L) passes the gradient up to and including L
      if (a > clamp_limit) return 0.0;
      const double k = clamp_alpha, s = sigmoid(k * a);
      return s * (1.0 + k * a * (1.0 - s));
    }
  }
  fail("act: not an Activation value");
}

// ---- index structures -----------------------------------------------------------------------

IndexArrays build_index(const int32_t* ids, int64_t T, int K, int E) {
  require(T >= 0, "T: must not be negative");
  require(K >= 1, "K: must be at least 1");
  require(E >= 1, "E: must be at least 1");
  if (T * K > std::numeric_limits<int32_t>::max())
    fail("T*K: " + std::to_string(T * K) + " exceeds the int32 index range");
  check_ids("topk_ids", ids, T, K, E);
  // Counting approach (docs/design.md "Index arrays"): per-expert counts, exclusive scan,
  // then a stable scatter in token-major slot order, which leaves token ids ascending inside
  // each expert.
  const int64_t slots = T * K;
  IndexArrays ix;
  ix.expert_token_offsets.assign(E + 1, 0);
  for (int64_t s = 0; s < slots; ++s) ++ix.expert_token_offsets[ids[s] + 1];
  for (int e = 0; e < E; ++e) ix.expert_token_offsets[e + 1] += ix.expert_token_offsets[e];
  std::vector<int32_t> cursor(ix.expert_token_offsets.begin(), ix.expert_token_offsets.end() - 1);
  ix.expert_token_indices.assign(slots, 0);
  ix.token_expert_indices.assign(ids, ids + slots);
  ix.token_index_map.assign(slots, 0);
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t pos = cursor[ids[s]]++;
    ix.expert_token_indices[pos] = static_cast<int32_t>(s / K);
    ix.token_index_map[s] = pos;
  }
  return ix;
}

IndexArrays build_index_left_out(const int32_t* ids, int64_t T, int K, int E) {
  require(T >= 0 && K >= 1 && E >= 1, "build_index_left_out: T >= 0, K >= 1, E >= 1");
  require(ids != nullptr || T == 0, "topk_ids: is null");
  const int64_t slots = T * K;
  auto in_range = [&](int64_t s) { return ids[s] >= 0 && ids[s] < E; };
  for (int64_t s = 0; s < slots; ++s)
    for (int64_t other = s / K * K; other < s; ++other)
      if (in_range(s) && ids[other] == ids[s])
        fail("topk_ids: token " + std::to_string(s / K) + " picks expert " + std::to_string(ids[s]) + " twice");
  IndexArrays ix;
  ix.expert_token_offsets.assign(E + 1, 0);
  for (int64_t s = 0; s < slots; ++s)
    if (in_range(s)) ++ix.expert_token_offsets[ids[s] + 1];
  for (int e = 0; e < E; ++e) ix.expert_token_offsets[e + 1] += ix.expert_token_offsets[e];
  std::vector<int32_t> cursor(ix.expert_token_offsets.begin(), ix.expert_token_offsets.end() - 1);
  ix.expert_token_indices.assign(slots, kLeftOutSlot);
  ix.token_expert_indices.assign(slots, kLeftOutSlot);
  ix.token_index_map.assign(slots, kLeftOutSlot);
  for (int64_t s = 0; s < slots; ++s) {
    if (!in_range(s)) continue;
    const int32_t pos = cursor[ids[s]]++;
    ix.expert_token_indices[pos] = static_cast<int32_t>(s / K);
    ix.token_expert_indices[s] = ids[s];
    ix.token_index_map[s] = pos;
  }
  return ix;
}

// ---- router -----------------------------------------------------------------------------------

std::vector<double> router_logits(const bf16* x, const bf16* w_router, int64_t T, int d, int E) {
  require(T >= 0, "T: must not be negative");
  require(d >= 1 && E >= 1, "router_logits: d and E must be positive");
  require(x != nullptr || T == 0, "x: is null");
  require(w_router != nullptr, "w_router: is null");
  // x rows take the weight role of the NT kernel (converted chunk by chunk); the small
  // router matrix is converted once and shared by all threads.
  std::vector<double> wr(int64_t(E) * d);
  to_double(w_router, int64_t(E) * d, wr.data());
  const auto wrows = row_ptrs(std::as_const(wr), d);
  std::vector<double> logits(T * E, 0.0);
  run_jobs(std::vector<NtJob>{{x, T, d, wrows.data(), E, logits.data(), E, 1}});
  return logits;
}

Routing route(const RouterSpec& spec, const double* logits, int64_t T, int E, int K,
              const float* bias) {
  check_router(spec, logits, T, E, K);
  const bool use_bias = spec.kind == RouterKind::sigmoid_topk && bias != nullptr;
  for (int e = 0; use_bias && e < E; ++e)
    if (!std::isfinite(bias[e])) fail("bias: value at expert " + std::to_string(e) + " is not finite");
  Routing r;
  r.ids.assign(T * K, 0);
  r.weights.assign(T * K, 0.0);
  for_each_token(spec, logits, T, E, [&](int64_t t, const std::vector<double>& p) {
    std::vector<double> score(E);
    std::vector<int32_t> order(E);
    for (int e = 0; e < E; ++e) {
      score[e] = p[e] + (use_bias ? double(bias[e]) : 0.0);
      order[e] = e;
    }
    // Descending score, ties towards the lower expert id.
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    });
    std::copy(order.begin(), order.begin() + K, r.ids.begin() + t * K);
    token_gates(spec, p.data(), r.ids.data() + t * K, K, r.weights.data() + t * K);
  });
  return r;
}

std::vector<double> gates_for(const RouterSpec& spec, const double* logits, const int32_t* ids,
                              int64_t T, int E, int K) {
  check_router(spec, logits, T, E, K);
  check_ids("ids", ids, T, K, E);
  std::vector<double> gates(T * K, 0.0);
  for_each_token(spec, logits, T, E, [&](int64_t t, const std::vector<double>& p) {
    token_gates(spec, p.data(), ids + t * K, K, gates.data() + t * K);
  });
  return gates;
}

std::vector<double> router_logits_grad(const RouterSpec& spec, const double* logits,
                                       const int32_t* ids, const double* d_gates, int64_t T,
                                       int E, int K) {
  check_router(spec, logits, T, E, K);
  check_ids("ids", ids, T, K, E);
  require(d_gates != nullptr || T == 0, "d_gates: is null");
  std::vector<double> dlogits(T * E, 0.0);
  for_each_token(spec, logits, T, E, [&](int64_t t, const std::vector<double>& p) {
    const int32_t* picked = ids + t * K;
    const double* dg = d_gates + t * K;
    // dL/dp at the picked experts (zero elsewhere): g_j = c p_j, or g_j = c p_j / P with
    // P = sum of the picked p, whose derivative is c (delta_jm / P - p_j / P^2).
    double P = 0, dg_dot_p = 0;
    for (int j = 0; j < K; ++j) P += p[picked[j]], dg_dot_p += dg[j] * p[picked[j]];
    std::vector<double> dp(K);
    for (int j = 0; j < K; ++j)
      dp[j] = spec.route_scale * (spec.renormalize ? dg[j] / P - dg_dot_p / (P * P) : dg[j]);
    double* dl = dlogits.data() + t * E;
    if (spec.kind == RouterKind::softmax_topk) {
      // Softmax Jacobian: dl_i = p_i (dp_i - sum_k p_k dp_k).
      double p_dot_dp = 0;
      for (int j = 0; j < K; ++j) p_dot_dp += p[picked[j]] * dp[j];
      for (int e = 0; e < E; ++e) dl[e] = -p[e] * p_dot_dp;
      for (int j = 0; j < K; ++j) dl[picked[j]] += p[picked[j]] * dp[j];
    } else {
      for (int j = 0; j < K; ++j) dl[picked[j]] = dp[j] * p[picked[j]] * (1.0 - p[picked[j]]);
    }
  });
  return dlogits;
}

// ---- experts ------------------------------------------------------------------------------

// Deliberately plain loops: the tests use it as an independent check of the blocked
// kernels behind forward_rows.
SlotForward slot_forward(const ExpertWeights& w, const bf16* x_row, int expert) {
  check_weights(w);
  require(x_row != nullptr, "x_row: is null");
  check_expert(expert, w.E);
  const bool gated = is_gated(w.act);
  const int64_t d = w.d, n = w.n, base = expert * n * d;
  SlotForward f;
  f.a.assign(n, 0.0);
  if (gated) f.b.assign(n, 0.0);
  f.h.assign(n, 0.0);
  f.o.assign(d, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < d; ++c) {
      f.a[i] += double(to_float(x_row[c])) * to_float(w.w1[base + i * d + c]);
      if (gated) f.b[i] += double(to_float(x_row[c])) * to_float(w.w3[base + i * d + c]);
    }
    if (w.b_up) {
      const int64_t gn = (gated ? 2 : 1) * n;
      f.a[i] += to_float(w.b_up[expert * gn + i]);
      if (gated) f.b[i] += to_float(w.b_up[expert * gn + n + i]);
    }
    f.h[i] = activation(w.act, f.a[i]) * (gated ? up_factor(w.act, f.b[i]) : 1.0);
  }
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t i = 0; i < n; ++i) f.o[c] += f.h[i] * to_float(w.w2[base + c * n + i]);
    if (w.b_down) f.o[c] += to_float(w.b_down[expert * d + c]);
  }
  return f;
}

std::vector<double> forward_rows(const ExpertWeights& w, const bf16* x, const int32_t* ids,
                                 const double* gates, int K, const std::vector<int64_t>& tokens) {
  check_request(w, x, ids, gates, K);
  const int64_t d = w.d;
  const std::vector<double> xrows = gather_rows(x, tokens, d);
  SlotSet set;
  const auto position = group_slots(ids, gates, K, tokens, w.E, xrows.data(), nullptr, d, set);
  const UpResult up = up_pass(w, set);
  std::vector<double> o(set.size() * d, 0.0);  // o = h W2^T (+ b_down) per slot
  nt_pass(set, w.w2, d, w.n, row_ptrs(up.h, w.n), o.data());
  if (w.b_down)
    for (size_t k = 0; k < set.experts.size(); ++k)
      for (int64_t s = set.begin[k]; s < set.begin[k + 1]; ++s)
        for (int64_t c = 0; c < d; ++c) o[s * d + c] += to_float(w.b_down[set.experts[k] * d + c]);
  std::vector<double> y(tokens.size() * d, 0.0);
  parallel_tasks(int64_t(tokens.size()), [&](int64_t i) {
    for (int j = 0; j < K; ++j) {  // y_t = sum_j g_tj o_tj, in pick order
      const int64_t p = position[i * K + j];
      for (int64_t c = 0; c < d; ++c) y[i * d + c] += set.gate[p] * o[p * d + c];
    }
  });
  return y;
}

TokenGrads backward_rows(const ExpertWeights& w, const bf16* x, const bf16* dy, const int32_t* ids,
                         const double* gates, int K, const std::vector<int64_t>& tokens) {
  check_request(w, x, ids, gates, K);
  require(dy != nullptr, "dy: is null");
  const int64_t d = w.d, n = w.n;
  const std::vector<double> xrows = gather_rows(x, tokens, d), dyrows = gather_rows(dy, tokens, d);
  SlotSet set;
  const auto position =
      group_slots(ids, gates, K, tokens, w.E, xrows.data(), dyrows.data(), d, set);
  const BackResult b = back_pass(w, set);
  // dx of every slot = dA W1 + dB W3; then each token sums its K slots in pick order.
  std::vector<double> dxslot(set.size() * d, 0.0);
  nn_pass(set, n, d, w.w1, row_ptrs(b.da, n), is_gated(w.act) ? w.w3 : nullptr, row_ptrs(b.db, n),
          row_ptrs(dxslot, d));
  TokenGrads g;
  g.dx.assign(tokens.size() * d, 0.0);
  g.d_gates.assign(tokens.size() * K, 0.0);
  parallel_tasks(int64_t(tokens.size()), [&](int64_t i) {
    for (int j = 0; j < K; ++j) {
      const int64_t p = position[i * K + j];
      g.d_gates[i * K + j] = b.dg[p];
      for (int64_t c = 0; c < d; ++c) g.dx[i * d + c] += dxslot[p * d + c];
    }
  });
  return g;
}

ExpertGrads expert_weight_grads(const ExpertWeights& w, const bf16* x, const bf16* dy,
                                const int32_t* ids, const double* gates, int64_t T, int K,
                                int expert) {
  check_request(w, x, ids, gates, K);
  require(dy != nullptr, "dy: is null");
  require(T >= 0, "T: must not be negative");
  check_expert(expert, w.E);
  const int64_t d = w.d, n = w.n;
  const bool gated = is_gated(w.act);
  // The expert's slots in token-major order, each with its own x and dy row.
  SlotSet set;
  std::vector<int64_t> slot_token;
  for (int64_t s = 0; s < T * K; ++s) {
    check_id("ids", ids[s], s, w.E);
    if (ids[s] != expert) continue;
    slot_token.push_back(s / K);
    set.gate.push_back(gates[s]);
  }
  const std::vector<double> xrows = gather_rows(x, slot_token, d);
  const std::vector<double> dyrows = gather_rows(dy, slot_token, d);
  set.x = row_ptrs(xrows, d);
  set.dy = row_ptrs(dyrows, d);
  set.experts = {expert};
  set.begin = {0, int64_t(slot_token.size())};
  const BackResult b = back_pass(w, set);
  const int64_t S = set.size();
  std::vector<double> gdy(S * d);  // g * dy, the left factor of dW2
  for (int64_t s = 0; s < S; ++s)
    for (int64_t c = 0; c < d; ++c) gdy[s * d + c] = set.gate[s] * set.dy[s][c];
  ExpertGrads g;
  g.dw1.assign(n * d, 0.0);
  if (gated) g.dw3.assign(n * d, 0.0);
  g.dw2.assign(d * n, 0.0);
  // dW1 = dA^T x, dW3 = dB^T x, dW2 = (g dy)^T h.
  const auto da = row_ptrs(b.da, n), db = row_ptrs(b.db, n), h = row_ptrs(b.up.h, n);
  const auto gdyp = row_ptrs(std::as_const(gdy), d);
  std::vector<TnJob> jobs{{g.dw1.data(), n, d, da.data(), set.x.data(), S},
                          {g.dw2.data(), d, n, gdyp.data(), h.data(), S}};
  if (gated) jobs.push_back({g.dw3.data(), n, d, db.data(), set.x.data(), S});
  run_jobs(jobs);
  if (w.b_up) {  // d b_up = sum over slots of [dA | dB], d b_down = sum of g dy
    g.d_bias_up.assign((gated ? 2 : 1) * n, 0.0);
    g.d_bias_down.assign(d, 0.0);
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t i = 0; i < n; ++i) {
        g.d_bias_up[i] += b.da[s * n + i];
        if (gated) g.d_bias_up[n + i] += b.db[s * n + i];
      }
      for (int64_t c = 0; c < d; ++c) g.d_bias_down[c] += gdy[s * d + c];
    }
  }
  return g;
}

std::vector<double> router_dx_rows(const double* dlogits, const bf16* w_router, int E, int d,
                                   const std::vector<int64_t>& tokens) {
  require(E >= 1 && d >= 1, "router_dx_rows: E and d must be positive");
  require(dlogits != nullptr || tokens.empty(), "dlogits: is null");
  require(w_router != nullptr, "w_router: is null");
  std::vector<double> dx(tokens.size() * d, 0.0);
  std::vector<const double*> coef(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    check_token(tokens[i], i);
    coef[i] = dlogits + tokens[i] * E;
  }
  const auto out = row_ptrs(dx, d);
  const NnJob job{1, {w_router, nullptr}, {coef.data(), nullptr}, E, d, int64_t(tokens.size()),
                  out.data()};
  run_jobs(std::vector<NnJob>{job});
  return dx;
}

std::vector<double> router_weight_grad(const double* dlogits, const bf16* x, int64_t T, int E,
                                       int d) {
  require(T >= 0, "T: must not be negative");
  require(E >= 1 && d >= 1, "router_weight_grad: E and d must be positive");
  require((dlogits != nullptr && x != nullptr) || T == 0, "router_weight_grad: dlogits or x is null");
  std::vector<double> g(int64_t(E) * d, 0.0);
  // Token blocks bound the double copy of x; they are summed in order (deterministic).
  const int64_t block = std::max<int64_t>(1, (int64_t(1) << 22) / d);
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    std::vector<int64_t> rows(std::min(block, T - t0));
    std::vector<const double*> p(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i] = t0 + int64_t(i);
      p[i] = dlogits + rows[i] * E;
    }
    const std::vector<double> xb = gather_rows(x, rows, d);
    const auto q = row_ptrs(xb, d);
    run_jobs(std::vector<TnJob>{{g.data(), E, d, p.data(), q.data(), int64_t(rows.size())}});
  }
  return g;
}

// ---- comparison -----------------------------------------------------------------------------

double relative_error(const double* got, const double* ref, size_t count) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i]))
      return std::numeric_limits<double>::infinity();
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (norm == 0) return diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

}  // namespace moeblaze::reference
