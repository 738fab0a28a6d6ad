// CPU reference of the MoE layer: see reference.hpp for the contract and DESIGN.md
// 1.1-1.3 for the math. Everything is computed in double from bf16 inputs.
//
// Speed matters because GPU checks call this on real model shapes (d=7168, n=2048, K=8,
// hundreds of tokens). The expert functions therefore group the requested slots by expert
// and run three small blocked kernels over each expert's weights, so a weight row is
// converted from bf16 once and then used for every slot routed to that expert:
//   NT  out[r,s] = <W[r,:], V_s>           up- and down-projection (x W1^T, h W2^T)
//   NN  out_s   += sum_r coef_s[r] W[r,:]   dgrads (dy W2, dA W1 + dB W3)
//   TN  G[r,c]  += sum_s P_s[r] Q_s[c]      weight grads (dA^T x, (g dy)^T h)
// Work is split into (job, chunk) tasks handed to std::thread workers. Every output
// element is summed by one task in an order fixed by the shapes alone, so results do not
// depend on the number of threads.
#include "reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <numbers>
#include <stdexcept>
#include <string>
#include <thread>

namespace moeblaze::reference {
namespace {

// ---- errors and threads ----------------------------------------------------------------

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

void require(bool ok, const char* message) {
  if (!ok) fail(message);
}

// Runs body(i) for i in [0, count) on hardware_concurrency() threads (dynamic schedule);
// the first exception thrown by a task is rethrown here after all threads joined.
template <class F>
void parallel_for(int64_t count, F&& body) {
  if (count <= 0) return;
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t nthreads = std::min(hw, count);
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (int64_t i; (i = next.fetch_add(1)) < count;) body(i);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(count);
    }
  };
  std::vector<std::thread> threads;
  for (int64_t k = 1; k < nthreads; ++k) {
    try {
      threads.emplace_back(work);
    } catch (...) {
      break;  // fewer threads is still correct
    }
  }
  work();
  for (auto& th : threads) th.join();
  if (error) std::rethrow_exception(error);
}

// Runs body(job, chunk) for every chunk of every job, all in one parallel region, so
// that many small jobs (one per expert) still keep every thread busy.
template <class F>
void for_chunks(const std::vector<int64_t>& chunks_per_job, F&& body) {
  std::vector<int64_t> first(chunks_per_job.size() + 1, 0);
  for (size_t j = 0; j < chunks_per_job.size(); ++j) first[j + 1] = first[j] + chunks_per_job[j];
  parallel_for(first.back(), [&](int64_t task) {
    const size_t job = std::upper_bound(first.begin(), first.end(), task) - first.begin() - 1;
    body(job, task - first[job]);
  });
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scratch that lives as long as the worker thread (worker threads live for one call).
double* scratch(size_t count) {
  thread_local std::vector<double> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// ---- vector micro-kernels (GCC/Clang vector extension: 4 doubles) -----------------------

typedef double v4d __attribute__((vector_size(32)));

void to_double(const bf16* in, int64_t count, double* out) {
  for (int64_t k = 0; k < count; ++k) out[k] = to_float(in[k]);
}

// out[q] = <a[q], b> for q < 4.
void dot4(const double* const a[4], const double* b, int64_t len, double out[4]) {
  v4d s0 = {0, 0, 0, 0}, s1 = s0, s2 = s0, s3 = s0;
  int64_t k = 0;
  for (; k + 4 <= len; k += 4) {
    v4d x, w0, w1, w2, w3;  // memcpy: unaligned loads, no vector-typed function returns
    std::memcpy(&x, b + k, sizeof x);
    std::memcpy(&w0, a[0] + k, sizeof x);
    std::memcpy(&w1, a[1] + k, sizeof x);
    std::memcpy(&w2, a[2] + k, sizeof x);
    std::memcpy(&w3, a[3] + k, sizeof x);
    s0 += w0 * x;
    s1 += w1 * x;
    s2 += w2 * x;
    s3 += w3 * x;
  }
  const v4d* s[4] = {&s0, &s1, &s2, &s3};
  for (int q = 0; q < 4; ++q) {
    double r = ((*s[q])[0] + (*s[q])[1]) + ((*s[q])[2] + (*s[q])[3]);
    for (int64_t t = k; t < len; ++t) r += a[q][t] * b[t];
    out[q] = r;
  }
}

// y += c[0] a[0] + ... + c[m-1] a[m-1], m <= 4.
void axpy_rows(int m, const double* c, const double* const a[4], double* y, int64_t len) {
  if (m == 4) {
    const double c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    for (int64_t k = 0; k < len; ++k)
      y[k] += (c0 * a[0][k] + c1 * a[1][k]) + (c2 * a[2][k] + c3 * a[3][k]);
    return;
  }
  for (int q = 0; q < m; ++q) {
    const double cq = c[q];
    for (int64_t k = 0; k < len; ++k) y[k] += cq * a[q][k];
  }
}

// ---- blocked kernels ----------------------------------------------------------------

// out[r*out_r + s*out_s] = <W[r,:], v[s]> for r < rows, s < S; W bf16 [rows, len].
struct NtJob {
  const bf16* w;
  int64_t rows, len;
  const double* const* v;
  int64_t S;
  double* out;
  int64_t out_r, out_s;
};
int64_t nt_chunk_rows(int64_t len) { return std::clamp<int64_t>(65536 / len / 4 * 4, 4, 64); }
int64_t nt_chunks(const NtJob& j) { return ceil_div(j.rows, nt_chunk_rows(j.len)); }

void nt_chunk(const NtJob& j, int64_t chunk) {
  const int64_t r0 = chunk * nt_chunk_rows(j.len);
  const int64_t m = std::min(nt_chunk_rows(j.len), j.rows - r0);
  double* rows = scratch(m * j.len);  // this chunk's weight rows, converted once
  for (int64_t r = 0; r < m; ++r) to_double(j.w + (r0 + r) * j.len, j.len, rows + r * j.len);
  const int64_t vblock = std::clamp<int64_t>(65536 / j.len, 1, 64);  // vectors kept in cache
  for (int64_t s0 = 0; s0 < j.S; s0 += vblock) {
    const int64_t s1 = std::min(j.S, s0 + vblock);
    for (int64_t rt = 0; rt < m; rt += 4) {
      const int q_count = static_cast<int>(std::min<int64_t>(4, m - rt));
      const double* a[4];
      for (int q = 0; q < 4; ++q) a[q] = rows + (rt + std::min(q, q_count - 1)) * j.len;
      for (int64_t s = s0; s < s1; ++s) {
        double d4[4];
        dot4(a, j.v[s], j.len, d4);
        for (int q = 0; q < q_count; ++q) j.out[(r0 + rt + q) * j.out_r + s * j.out_s] = d4[q];
      }
    }
  }
}

// out[s][c] += sum over terms of sum_r coef[s][r] W[r,c]; W bf16 [rows, cols]. Tasks own
// column chunks, so a chunk sums its rows in order (deterministic, no atomics).
struct NnJob {
  int terms;
  const bf16* w[2];
  const double* const* coef[2];
  int64_t rows, cols, S;
  double* const* out;
};
constexpr int64_t nn_chunk_cols = 256;
int64_t nn_chunks(const NnJob& j) { return ceil_div(j.cols, nn_chunk_cols); }

void nn_chunk(const NnJob& j, int64_t chunk) {
  const int64_t c0 = chunk * nn_chunk_cols, width = std::min(nn_chunk_cols, j.cols - c0);
  double* seg = scratch(4 * width);
  for (int term = 0; term < j.terms; ++term) {
    for (int64_t r0 = 0; r0 < j.rows; r0 += 4) {
      const int m = static_cast<int>(std::min<int64_t>(4, j.rows - r0));
      const double* a[4] = {seg, seg, seg, seg};
      for (int q = 0; q < m; ++q) {
        to_double(j.w[term] + (r0 + q) * j.cols + c0, width, seg + q * width);
        a[q] = seg + q * width;
      }
      for (int64_t s = 0; s < j.S; ++s) axpy_rows(m, j.coef[term][s] + r0, a, j.out[s] + c0, width);
    }
  }
}

// G[r*cols + c] += sum_s p[s][r] q[s][c]. Tasks own 8-row x 512-column tiles of G.
struct TnJob {
  double* g;
  int64_t rows, cols;
  const double* const* p;
  const double* const* q;
  int64_t S;
};
constexpr int64_t tn_tile_rows = 8, tn_tile_cols = 512;
int64_t tn_chunks(const TnJob& j) {
  return ceil_div(j.rows, tn_tile_rows) * ceil_div(j.cols, tn_tile_cols);
}

void tn_chunk(const TnJob& j, int64_t chunk) {
  const int64_t col_tiles = ceil_div(j.cols, tn_tile_cols);
  const int64_t r0 = chunk / col_tiles * tn_tile_rows, c0 = chunk % col_tiles * tn_tile_cols;
  const int64_t r1 = std::min(j.rows, r0 + tn_tile_rows), width = std::min(tn_tile_cols, j.cols - c0);
  for (int64_t s0 = 0; s0 < j.S; s0 += 4) {
    const int m = static_cast<int>(std::min<int64_t>(4, j.S - s0));
    const double* a[4];
    for (int k = 0; k < 4; ++k) a[k] = j.q[s0 + std::min(k, m - 1)] + c0;
    for (int64_t r = r0; r < r1; ++r) {
      double c[4];
      for (int k = 0; k < m; ++k) c[k] = j.p[s0 + k][r];
      axpy_rows(m, c, a, j.g + r * j.cols + c0, width);
    }
  }
}

// ---- the expert passes, on slots grouped by expert --------------------------------------

void check_weights(const ExpertWeights& w) {
  require(w.E > 0 && w.d > 0 && w.n > 0, "ExpertWeights: E, d and n must be positive");
  require(w.w1 != nullptr, "ExpertWeights: w1 is null");
  require(w.w2 != nullptr, "ExpertWeights: w2 is null");
  require(!is_gated(w.act) || w.w3 != nullptr, "ExpertWeights: w3 is null for a gated activation");
  require(static_cast<int>(w.act) >= 0 && static_cast<int>(w.act) <= 4, "ExpertWeights: act is not an Activation");
}

const bf16* w1_of(const ExpertWeights& w, int e) { return w.w1 + int64_t(e) * w.n * w.d; }
const bf16* w3_of(const ExpertWeights& w, int e) { return w.w3 + int64_t(e) * w.n * w.d; }
const bf16* w2_of(const ExpertWeights& w, int e) { return w.w2 + int64_t(e) * w.d * w.n; }

// Slots sorted by expert (stable). Row pointers refer to caller-owned double rows.
struct SlotSet {
  std::vector<int> experts;          // active experts, ascending
  std::vector<int64_t> begin;        // experts.size()+1 offsets into the sorted slots
  std::vector<const double*> x, dy;  // per sorted slot: its token's x and dy rows (length d)
  std::vector<double> gate;          // per sorted slot
};

// Groups request slots (token row i, pick j) -> sorted order; returns position[i*K+j].
std::vector<int64_t> group_slots(const int32_t* ids, const double* gates, int K, const std::vector<int64_t>& tokens,
                                 int E, const double* xrows, const double* dyrows, int d, SlotSet& set) {
  const int64_t count = int64_t(tokens.size()) * K;
  std::vector<int64_t> per_expert(E + 1, 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) fail("tokens: token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) + " is negative");
    for (int j = 0; j < K; ++j) {
      const int32_t e = ids[tokens[i] * K + j];
      if (e < 0 || e >= E)
        fail("ids: id " + std::to_string(e) + " at slot " + std::to_string(tokens[i] * K + j) + " is outside [0, " +
             std::to_string(E) + ")");
      ++per_expert[e + 1];
    }
  }
  for (int e = 0; e < E; ++e) per_expert[e + 1] += per_expert[e];
  std::vector<int64_t> position(count), cursor(per_expert.begin(), per_expert.end() - 1);
  set.x.assign(count, nullptr);
  set.dy.assign(count, nullptr);
  set.gate.assign(count, 0.0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int j = 0; j < K; ++j) {
      const int64_t slot = tokens[i] * K + j, p = cursor[ids[slot]]++;
      position[i * K + j] = p;
      set.x[p] = xrows + int64_t(i) * d;
      if (dyrows) set.dy[p] = dyrows + int64_t(i) * d;
      set.gate[p] = gates[slot];
    }
  }
  set.experts.clear();
  set.begin.assign(1, 0);
  for (int e = 0; e < E; ++e) {
    if (per_expert[e + 1] == per_expert[e]) continue;
    set.experts.push_back(e);
    set.begin.push_back(per_expert[e + 1]);
  }
  return position;
}

// Converts the listed bf16 rows [., d] into a dense double matrix [rows.size(), d].
std::vector<double> gather_rows(const bf16* src, const std::vector<int64_t>& rows, int d) {
  std::vector<double> out(rows.size() * size_t(d));
  parallel_for(int64_t(rows.size()), [&](int64_t i) { to_double(src + rows[i] * d, d, out.data() + i * d); });
  return out;
}

struct UpResult {
  std::vector<double> a, b, h;  // [S, n] each (b empty when not gated)
};

// A = x W1^T, B = x W3^T, h = act(A) (* B) for every slot of the set.
UpResult up_pass(const ExpertWeights& w, const SlotSet& set) {
  const int64_t S = set.begin.back(), n = w.n;
  const bool gated = is_gated(w.act);
  UpResult r;
  r.a.assign(S * n, 0.0);
  if (gated) r.b.assign(S * n, 0.0);
  std::vector<NtJob> jobs;
  for (size_t k = 0; k < set.experts.size(); ++k) {
    const int64_t b0 = set.begin[k], cnt = set.begin[k + 1] - b0;
    jobs.push_back({w1_of(w, set.experts[k]), n, w.d, set.x.data() + b0, cnt, r.a.data() + b0 * n, 1, n});
    if (gated) jobs.push_back({w3_of(w, set.experts[k]), n, w.d, set.x.data() + b0, cnt, r.b.data() + b0 * n, 1, n});
  }
  std::vector<int64_t> chunks;
  for (auto& j : jobs) chunks.push_back(nt_chunks(j));
  for_chunks(chunks, [&](size_t job, int64_t c) { nt_chunk(jobs[job], c); });
  r.h.resize(S * n);
  parallel_for(S, [&](int64_t s) {
    for (int64_t i = s * n; i < (s + 1) * n; ++i) r.h[i] = activation(w.act, r.a[i]) * (gated ? r.b[i] : 1.0);
  });
  return r;
}

// o = h W2^T for every slot: [S, d].
std::vector<double> down_pass(const ExpertWeights& w, const SlotSet& set, const std::vector<double>& h) {
  const int64_t S = set.begin.back(), n = w.n, d = w.d;
  std::vector<double> o(S * d, 0.0);
  std::vector<const double*> hrows(S);
  for (int64_t s = 0; s < S; ++s) hrows[s] = h.data() + s * n;
  std::vector<NtJob> jobs;
  for (size_t k = 0; k < set.experts.size(); ++k) {
    const int64_t b0 = set.begin[k];
    jobs.push_back({w2_of(w, set.experts[k]), d, n, hrows.data() + b0, set.begin[k + 1] - b0, o.data() + b0 * d, 1, d});
  }
  std::vector<int64_t> chunks;
  for (auto& j : jobs) chunks.push_back(nt_chunks(j));
  for_chunks(chunks, [&](size_t job, int64_t c) { nt_chunk(jobs[job], c); });
  return o;
}

// out_s += coef_s W (+ coef2_s W') for every slot, expert by expert. W is [rows, cols]
// of the slot's expert; `matrix` picks it from the weights.
template <class M1, class M2>
void nn_pass(const SlotSet& set, int64_t rows, int64_t cols, M1 matrix1, const std::vector<double>& coef1, M2 matrix2,
             const std::vector<double>* coef2, std::vector<double>& out) {
  const int64_t S = set.begin.back();
  std::vector<const double*> c1(S), c2(S);
  std::vector<double*> orow(S);
  for (int64_t s = 0; s < S; ++s) {
    c1[s] = coef1.data() + s * rows;
    c2[s] = coef2 ? coef2->data() + s * rows : nullptr;
    orow[s] = out.data() + s * cols;
  }
  std::vector<NnJob> jobs;
  for (size_t k = 0; k < set.experts.size(); ++k) {
    const int64_t b0 = set.begin[k];
    const int e = set.experts[k];
    jobs.push_back({coef2 ? 2 : 1, {matrix1(e), coef2 ? matrix2(e) : nullptr}, {c1.data() + b0, c2.data() + b0},
                    rows, cols, set.begin[k + 1] - b0, orow.data() + b0});
  }
  std::vector<int64_t> chunks;
  for (auto& j : jobs) chunks.push_back(nn_chunks(j));
  for_chunks(chunks, [&](size_t job, int64_t c) { nn_chunk(jobs[job], c); });
}

struct BackResult {
  UpResult up;
  std::vector<double> dg;      // [S] dL/dg per slot
  std::vector<double> da, db;  // [S, n]
};

// Everything backward needs up to dA, dB: recomputed A, B, h, then u = dy W2,
// dg = <u, h> (= <dy, o>), dh = g u, dA = dh B act'(A) (or dh act'(A)), dB = dh act(A).
BackResult back_pass(const ExpertWeights& w, const SlotSet& set) {
  const int64_t S = set.begin.back(), n = w.n;
  const bool gated = is_gated(w.act);
  BackResult r;
  r.up = up_pass(w, set);
  std::vector<double> u(S * n, 0.0), dyflat;
  // nn_pass wants coefficients as one [S, d] matrix; the dy rows are shared per token.
  dyflat.resize(S * w.d);
  for (int64_t s = 0; s < S; ++s) std::copy(set.dy[s], set.dy[s] + w.d, dyflat.data() + s * w.d);
  nn_pass(set, w.d, n, [&](int e) { return w2_of(w, e); }, dyflat, [&](int e) { return w2_of(w, e); }, nullptr, u);
  r.dg.assign(S, 0.0);
  r.da.assign(S * n, 0.0);
  if (gated) r.db.assign(S * n, 0.0);
  parallel_for(S, [&](int64_t s) {
    double dg = 0;
    for (int64_t i = 0; i < n; ++i) dg += u[s * n + i] * r.up.h[s * n + i];
    r.dg[s] = dg;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = s * n + i;
      const double dh = set.gate[s] * u[k], a = r.up.a[k];
      r.da[k] = dh * (gated ? r.up.b[k] : 1.0) * activation_grad(w.act, a);
      if (gated) r.db[k] = dh * activation(w.act, a);
    }
  });
  return r;
}

void check_rows_request(const ExpertWeights& w, const bf16* x, const int32_t* ids, const double* gates, int K) {
  check_weights(w);
  require(K >= 1, "K: must be at least 1");
  require(x != nullptr, "x: is null");
  require(ids != nullptr, "ids: is null");
  require(gates != nullptr, "gates: is null");
}

// ---- router helpers -------------------------------------------------------------------

double sigmoid(double a) {
  if (a >= 0) return 1.0 / (1.0 + std::exp(-a));
  const double z = std::exp(a);
  return z / (1.0 + z);
}

void check_router_shape(const double* logits, int64_t T, int E, int K) {
  require(T >= 0, "T: must not be negative");
  require(E >= 1, "E: must be at least 1");
  if (K < 1 || K > E) fail("K: " + std::to_string(K) + " is outside [1, E=" + std::to_string(E) + "]");
  require(logits != nullptr || T == 0, "logits: is null");
}

// p (softmax) or s (sigmoid) for one token's logits row.
void token_probs(const RouterSpec& spec, const double* l, int64_t t, int E, double* p) {
  for (int e = 0; e < E; ++e)
    if (!std::isfinite(l[e]))
      fail("logits: value at token " + std::to_string(t) + ", expert " + std::to_string(e) + " is not finite");
  if (spec.kind == RouterKind::softmax_topk) {
    const double m = *std::max_element(l, l + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - m));
    for (int e = 0; e < E; ++e) p[e] /= sum;
  } else if (spec.kind == RouterKind::sigmoid_topk) {
    for (int e = 0; e < E; ++e) p[e] = sigmoid(l[e]);
  } else {
    fail("spec.kind: RouterKind::none has no built-in router");
  }
}

// The K gates of one token from its probabilities and picked ids.
void token_gates(const RouterSpec& spec, const double* p, const int32_t* picked, int K, double* g) {
  double total = 0;
  for (int j = 0; j < K; ++j) total += p[picked[j]];
  for (int j = 0; j < K; ++j) g[j] = p[picked[j]] / (spec.renormalize ? total : 1.0) * spec.route_scale;
}

// Validates one token's K ids (range, duplicates); `name` is the argument's name.
void check_token_ids(const char* name, const int32_t* ids, int64_t t, int K, int E) {
  for (int j = 0; j < K; ++j) {
    const int64_t slot = t * K + j;
    if (ids[slot] < 0 || ids[slot] >= E)
      fail(std::string(name) + ": id " + std::to_string(ids[slot]) + " at slot " + std::to_string(slot) +
           " is outside [0, " + std::to_string(E) + ")");
    for (int k = 0; k < j; ++k)
      if (ids[t * K + k] == ids[slot])
        fail(std::string(name) + ": token " + std::to_string(t) + " picks expert " + std::to_string(ids[slot]) +
             " twice (slots " + std::to_string(t * K + k) + " and " + std::to_string(slot) + ")");
  }
}

constexpr int64_t router_token_block = 64;

}  // namespace

// ---- activations ---------------------------------------------------------------------

double activation(Activation act, double a) {
  switch (act) {
    case Activation::swiglu:
    case Activation::silu: return a * sigmoid(a);
    case Activation::geglu:
    case Activation::gelu: {
      const double u = std::sqrt(2.0 / std::numbers::pi) * (a + 0.044715 * a * a * a);
      return 0.5 * a * (1.0 + std::tanh(u));
    }
    case Activation::relu: return a > 0 ? a : 0.0;
  }
  fail("act: not an Activation value");
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
      const double c = std::sqrt(2.0 / std::numbers::pi);
      const double th = std::tanh(c * (a + 0.044715 * a * a * a));
      return 0.5 * (1.0 + th) + 0.5 * a * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * a * a);
    }
    case Activation::relu: return a > 0 ? 1.0 : 0.0;  // relu'(0) = 0
  }
  fail("act: not an Activation value");
}

// ---- index structures ------------------------------------------------------------------

IndexArrays build_index(const int32_t* ids, int64_t T, int K, int E) {
  require(T >= 0, "T: must not be negative");
  require(K >= 1, "K: must be at least 1");
  require(E >= 1, "E: must be at least 1");
  require(ids != nullptr || T == 0, "topk_ids: is null");
  if (T * K > std::numeric_limits<int32_t>::max()) fail("T*K: " + std::to_string(T * K) + " exceeds the int32 index range");
  const int64_t slots = T * K;
  for (int64_t t = 0; t < T; ++t) check_token_ids("topk_ids", ids, t, K, E);

  // Counting approach (DESIGN.md 1.2): per-expert counts, exclusive scan, then a stable
  // scatter in token-major slot order, which leaves token ids ascending inside each expert.
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

// ---- router ----------------------------------------------------------------------------

std::vector<double> router_logits(const bf16* x, const bf16* w_router, int64_t T, int d, int E) {
  require(T >= 0, "T: must not be negative");
  require(d >= 1, "d: must be at least 1");
  require(E >= 1, "E: must be at least 1");
  require(x != nullptr || T == 0, "x: is null");
  require(w_router != nullptr, "w_router: is null");
  // x rows play the weight role of the NT kernel (converted chunk by chunk), the small
  // router matrix is converted once and shared by all threads.
  std::vector<double> wr(int64_t(E) * d);
  to_double(w_router, int64_t(E) * d, wr.data());
  std::vector<const double*> wrows(E);
  for (int e = 0; e < E; ++e) wrows[e] = wr.data() + int64_t(e) * d;
  std::vector<double> logits(T * E, 0.0);
  const NtJob job{x, T, d, wrows.data(), E, logits.data(), E, 1};
  parallel_for(nt_chunks(job), [&](int64_t c) { nt_chunk(job, c); });
  return logits;
}

Routing route(const RouterSpec& spec, const double* logits, int64_t T, int E, int K, const float* bias) {
  check_router_shape(logits, T, E, K);
  const bool use_bias = spec.kind == RouterKind::sigmoid_topk && bias != nullptr;
  if (use_bias)
    for (int e = 0; e < E; ++e)
      if (!std::isfinite(bias[e])) fail("bias: value at expert " + std::to_string(e) + " is not finite");
  Routing r;
  r.ids.assign(T * K, 0);
  r.weights.assign(T * K, 0.0);
  parallel_for(ceil_div(T, router_token_block), [&](int64_t block) {
    std::vector<double> p(E), score(E);
    std::vector<int32_t> order(E);
    for (int64_t t = block * router_token_block; t < std::min(T, (block + 1) * router_token_block); ++t) {
      token_probs(spec, logits + t * E, t, E, p.data());
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
    }
  });
  return r;
}

std::vector<double> gates_for(const RouterSpec& spec, const double* logits, const int32_t* ids, int64_t T, int E,
                              int K) {
  check_router_shape(logits, T, E, K);
  require(ids != nullptr || T == 0, "ids: is null");
  for (int64_t t = 0; t < T; ++t) check_token_ids("ids", ids, t, K, E);
  std::vector<double> gates(T * K, 0.0);
  parallel_for(ceil_div(T, router_token_block), [&](int64_t block) {
    std::vector<double> p(E);
    for (int64_t t = block * router_token_block; t < std::min(T, (block + 1) * router_token_block); ++t) {
      token_probs(spec, logits + t * E, t, E, p.data());
      token_gates(spec, p.data(), ids + t * K, K, gates.data() + t * K);
    }
  });
  return gates;
}

std::vector<double> router_logits_grad(const RouterSpec& spec, const double* logits, const int32_t* ids,
                                       const double* d_gates, int64_t T, int E, int K) {
  check_router_shape(logits, T, E, K);
  require(ids != nullptr || T == 0, "ids: is null");
  require(d_gates != nullptr || T == 0, "d_gates: is null");
  for (int64_t t = 0; t < T; ++t) check_token_ids("ids", ids, t, K, E);
  std::vector<double> dlogits(T * E, 0.0);
  parallel_for(ceil_div(T, router_token_block), [&](int64_t block) {
    std::vector<double> p(E), dp(E);
    for (int64_t t = block * router_token_block; t < std::min(T, (block + 1) * router_token_block); ++t) {
      token_probs(spec, logits + t * E, t, E, p.data());
      const int32_t* picked = ids + t * K;
      const double* dg = d_gates + t * K;
      // dL/dp at the picked experts: g_j = c p_j, or c p_j / P with P = sum of picked p,
      // whose derivative is c (delta_jm / P - p_j / P^2).
      std::fill(dp.begin(), dp.end(), 0.0);
      double P = 0, dg_dot_p = 0;
      for (int j = 0; j < K; ++j) {
        P += p[picked[j]];
        dg_dot_p += dg[j] * p[picked[j]];
      }
      for (int j = 0; j < K; ++j)
        dp[picked[j]] = spec.route_scale * (spec.renormalize ? dg[j] / P - dg_dot_p / (P * P) : dg[j]);
      double* dl = dlogits.data() + t * E;
      if (spec.kind == RouterKind::softmax_topk) {
        double p_dot_dp = 0;  // softmax Jacobian: dl_i = p_i (dp_i - sum_k p_k dp_k)
        for (int j = 0; j < K; ++j) p_dot_dp += p[picked[j]] * dp[picked[j]];
        for (int e = 0; e < E; ++e) dl[e] = p[e] * (dp[e] - p_dot_dp);
      } else {
        for (int j = 0; j < K; ++j) dl[picked[j]] = dp[picked[j]] * p[picked[j]] * (1.0 - p[picked[j]]);
      }
    }
  });
  return dlogits;
}

// ---- experts ---------------------------------------------------------------------------

// Deliberately the plain textbook loops: the tests use it as an independent check of the
// blocked kernels behind forward_rows.
SlotForward slot_forward(const ExpertWeights& w, const bf16* x_row, int expert) {
  check_weights(w);
  require(x_row != nullptr, "x_row: is null");
  if (expert < 0 || expert >= w.E)
    fail("expert: " + std::to_string(expert) + " is outside [0, " + std::to_string(w.E) + ")");
  const bool gated = is_gated(w.act);
  const int64_t d = w.d, n = w.n;
  SlotForward f;
  f.a.assign(n, 0.0);
  if (gated) f.b.assign(n, 0.0);
  f.h.assign(n, 0.0);
  f.o.assign(d, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < d; ++c) {
      f.a[i] += double(to_float(x_row[c])) * to_float(w1_of(w, expert)[i * d + c]);
      if (gated) f.b[i] += double(to_float(x_row[c])) * to_float(w3_of(w, expert)[i * d + c]);
    }
    f.h[i] = activation(w.act, f.a[i]) * (gated ? f.b[i] : 1.0);
  }
  for (int64_t c = 0; c < d; ++c)
    for (int64_t i = 0; i < n; ++i) f.o[c] += f.h[i] * to_float(w2_of(w, expert)[c * n + i]);
  return f;
}

std::vector<double> forward_rows(const ExpertWeights& w, const bf16* x, const int32_t* ids, const double* gates,
                                 int K, const std::vector<int64_t>& tokens) {
  check_rows_request(w, x, ids, gates, K);
  const int d = w.d;
  const std::vector<double> xrows = gather_rows(x, tokens, d);
  SlotSet set;
  const auto position = group_slots(ids, gates, K, tokens, w.E, xrows.data(), nullptr, d, set);
  const UpResult up = up_pass(w, set);
  const std::vector<double> o = down_pass(w, set, up.h);
  std::vector<double> y(tokens.size() * size_t(d), 0.0);
  parallel_for(int64_t(tokens.size()), [&](int64_t i) {
    for (int j = 0; j < K; ++j) {  // y_t = sum_j g_tj o_tj, in pick order
      const int64_t p = position[i * K + j];
      for (int64_t c = 0; c < d; ++c) y[i * d + c] += set.gate[p] * o[p * d + c];
    }
  });
  return y;
}

TokenGrads backward_rows(const ExpertWeights& w, const bf16* x, const bf16* dy, const int32_t* ids,
                         const double* gates, int K, const std::vector<int64_t>& tokens) {
  check_rows_request(w, x, ids, gates, K);
  require(dy != nullptr, "dy: is null");
  const int64_t d = w.d, n = w.n;
  const std::vector<double> xrows = gather_rows(x, tokens, w.d), dyrows = gather_rows(dy, tokens, w.d);
  SlotSet set;
  const auto position = group_slots(ids, gates, K, tokens, w.E, xrows.data(), dyrows.data(), w.d, set);
  const BackResult b = back_pass(w, set);
  // dx of every slot = dA W1 + dB W3, then each token sums its K slots in pick order.
  std::vector<double> dxslot(set.begin.back() * d, 0.0);
  nn_pass(set, n, d, [&](int e) { return w1_of(w, e); }, b.da, [&](int e) { return w3_of(w, e); },
          is_gated(w.act) ? &b.db : nullptr, dxslot);
  TokenGrads g;
  g.dx.assign(tokens.size() * d, 0.0);
  g.d_gates.assign(tokens.size() * K, 0.0);
  parallel_for(int64_t(tokens.size()), [&](int64_t i) {
    for (int j = 0; j < K; ++j) {
      const int64_t p = position[i * K + j];
      g.d_gates[i * K + j] = b.dg[p];
      for (int64_t c = 0; c < d; ++c) g.dx[i * d + c] += dxslot[p * d + c];
    }
  });
  return g;
}

ExpertGrads expert_weight_grads(const ExpertWeights& w, const bf16* x, const bf16* dy, const int32_t* ids,
                                const double* gates, int64_t T, int K, int expert) {
  check_rows_request(w, x, ids, gates, K);
  require(dy != nullptr, "dy: is null");
  require(T >= 0, "T: must not be negative");
  if (expert < 0 || expert >= w.E)
    fail("expert: " + std::to_string(expert) + " is outside [0, " + std::to_string(w.E) + ")");
  const int64_t d = w.d, n = w.n;
  // The expert's slots in token-major order; each gets its own x/dy row (one request
  // "token" per slot, K=1) so that group_slots can be reused.
  std::vector<int64_t> slot_tokens;
  std::vector<int32_t> one_ids;
  std::vector<double> one_gates;
  for (int64_t s = 0; s < T * K; ++s) {
    if (ids[s] < 0 || ids[s] >= w.E)
      fail("ids: id " + std::to_string(ids[s]) + " at slot " + std::to_string(s) + " is outside [0, " +
           std::to_string(w.E) + ")");
    if (ids[s] != expert) continue;
    slot_tokens.push_back(s / K);
    one_ids.push_back(expert);
    one_gates.push_back(gates[s]);
  }
  std::vector<int64_t> request(slot_tokens.size());
  for (size_t i = 0; i < request.size(); ++i) request[i] = int64_t(i);
  const std::vector<double> xrows = gather_rows(x, slot_tokens, w.d), dyrows = gather_rows(dy, slot_tokens, w.d);
  SlotSet set;
  group_slots(one_ids.data(), one_gates.data(), 1, request, w.E, xrows.data(), dyrows.data(), w.d, set);
  const BackResult b = back_pass(w, set);

  const int64_t S = set.begin.back();
  const bool gated = is_gated(w.act);
  std::vector<double> gdy(S * d);  // g * dy, the left factor of dW2
  std::vector<const double*> da(S), db(S), h(S), gdyp(S);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t c = 0; c < d; ++c) gdy[s * d + c] = set.gate[s] * set.dy[s][c];
    da[s] = b.da.data() + s * n;
    db[s] = gated ? b.db.data() + s * n : nullptr;
    h[s] = b.up.h.data() + s * n;
    gdyp[s] = gdy.data() + s * d;
  }
  ExpertGrads g;
  g.dw1.assign(n * d, 0.0);
  if (gated) g.dw3.assign(n * d, 0.0);
  g.dw2.assign(d * n, 0.0);
  std::vector<TnJob> jobs{{g.dw1.data(), n, d, da.data(), set.x.data(), S}, {g.dw2.data(), d, n, gdyp.data(), h.data(), S}};
  if (gated) jobs.push_back({g.dw3.data(), n, d, db.data(), set.x.data(), S});
  std::vector<int64_t> chunks;
  for (auto& j : jobs) chunks.push_back(tn_chunks(j));
  for_chunks(chunks, [&](size_t job, int64_t c) { tn_chunk(jobs[job], c); });
  return g;
}

std::vector<double> router_dx_rows(const double* dlogits, const bf16* w_router, int E, int d,
                                   const std::vector<int64_t>& tokens) {
  require(E >= 1 && d >= 1, "router_dx_rows: E and d must be positive");
  require(dlogits != nullptr, "dlogits: is null");
  require(w_router != nullptr, "w_router: is null");
  std::vector<double> dx(tokens.size() * size_t(d), 0.0);
  std::vector<const double*> coef(tokens.size());
  std::vector<double*> out(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) fail("tokens: token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) + " is negative");
    coef[i] = dlogits + tokens[i] * E;
    out[i] = dx.data() + i * d;
  }
  const NnJob job{1, {w_router, nullptr}, {coef.data(), nullptr}, E, d, int64_t(tokens.size()), out.data()};
  parallel_for(nn_chunks(job), [&](int64_t c) { nn_chunk(job, c); });
  return dx;
}

std::vector<double> router_weight_grad(const double* dlogits, const bf16* x, int64_t T, int E, int d) {
  require(T >= 0, "T: must not be negative");
  require(E >= 1 && d >= 1, "router_weight_grad: E and d must be positive");
  require((dlogits != nullptr && x != nullptr) || T == 0, "router_weight_grad: dlogits or x is null");
  std::vector<double> g(int64_t(E) * d, 0.0);
  // Token blocks bound the double copy of x; blocks are summed in order (deterministic).
  const int64_t block = std::max<int64_t>(1, (int64_t(1) << 22) / d);
  std::vector<double> xb;
  std::vector<const double*> p, q;
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    const int64_t cnt = std::min(block, T - t0);
    std::vector<int64_t> rows(cnt);
    for (int64_t i = 0; i < cnt; ++i) rows[i] = t0 + i;
    xb = gather_rows(x, rows, d);
    p.resize(cnt);
    q.resize(cnt);
    for (int64_t i = 0; i < cnt; ++i) {
      p[i] = dlogits + (t0 + i) * E;
      q[i] = xb.data() + i * d;
    }
    const TnJob job{g.data(), E, d, p.data(), q.data(), cnt};
    parallel_for(tn_chunks(job), [&](int64_t c) { tn_chunk(job, c); });
  }
  return g;
}

// ---- comparison ------------------------------------------------------------------------

double relative_error(const double* got, const double* ref, size_t count) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (norm == 0) return diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

}  // namespace moeblaze::reference
