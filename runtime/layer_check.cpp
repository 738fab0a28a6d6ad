#include "layer_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "host_data.hpp"
#include "kernel_loader.hpp"

#include <optional>
#include "reference/reference.hpp"

namespace moeblaze {
namespace {

constexpr uint16_t kPoisonBf16 = 0xffff;    // a NaN
constexpr uint32_t kPoisonF32 = 0xffffffffu;  // a NaN

bool is_nan_bf16(bf16 v) { return (v.bits & 0x7f80) == 0x7f80 && (v.bits & 0x7f) != 0; }

template <class T>
std::vector<T> download(const DeviceBuffer& b, size_t count, size_t offset_bytes = 0) {
  std::vector<T> v(count);
  b.download(v.data(), count * sizeof(T), offset_bytes);
  return v;
}
template <class T>
std::vector<T> download_ptr(CUdeviceptr p, size_t count) {
  std::vector<T> v(count);
  if (count) MB_CU(cuda_driver().cuMemcpyDtoH(v.data(), p, count * sizeof(T)));
  return v;
}

double rel_error_bf16(const std::vector<bf16>& got, const std::vector<double>& ref) {
  std::vector<double> g(got.size());
  for (size_t i = 0; i < got.size(); ++i) g[i] = to_float(got[i]);
  return reference::relative_error(g.data(), ref.data(), g.size());
}

template <class T>
bool has_poison(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return std::any_of(v.begin(), v.end(), is_nan_bf16);
  } else {
    return std::any_of(v.begin(), v.end(), [](float f) { return std::isnan(f); });
  }
}

// Word-at-a-time 64-bit hash (fast enough for tens of gigabytes).
unsigned long long hash_bytes(const char* p, size_t len) {
  unsigned long long h = 0x9E3779B97F4A7C15ull ^ len;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    unsigned long long w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (; i < len; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001B3ull;
  return h;
}

// Every buffer the check reads back, hashed in chunks (the outputs of a large shape do not
// fit in host memory twice), for the bitwise comparison of two runs.
struct Snapshot {
  std::vector<std::pair<std::string, std::vector<unsigned long long>>> parts;
  void add(const std::string& name, CUdeviceptr p, size_t bytes) {
    constexpr size_t kChunk = size_t{64} << 20;
    std::vector<char> buf(std::min(bytes, kChunk));
    std::vector<unsigned long long> hashes;
    for (size_t at = 0; at < bytes; at += kChunk) {
      const size_t len = std::min(kChunk, bytes - at);
      MB_CU(cuda_driver().cuMemcpyDtoH(buf.data(), p + at, len));
      hashes.push_back(hash_bytes(buf.data(), len));
    }
    parts.emplace_back(name, std::move(hashes));
  }
};

}  // namespace

std::string to_string(RoutingDistribution r) {
  switch (r) {
    case RoutingDistribution::random: return "random";
    case RoutingDistribution::skewed: return "skewed";
    case RoutingDistribution::balanced: return "balanced";
    case RoutingDistribution::one_hot: return "one-hot";
  }
  return "unknown";
}

RoutingDistribution parse_routing(const std::string& s) {
  for (auto r : {RoutingDistribution::random, RoutingDistribution::skewed, RoutingDistribution::balanced,
                 RoutingDistribution::one_hot})
    if (to_string(r) == s) return r;
  throw InvalidArgument("routing", fmt::format("'{}' is not one of random, skewed, balanced, one-hot", s));
}

double LayerCheckResult::max_error() const {
  double m = 0;
  for (const auto& e : errors) m = std::max(m, std::isnan(e.rel_error) ? INFINITY : e.rel_error);
  return m;
}

bool LayerCheckResult::passed(double tolerance) const {
  for (const auto& e : errors)
    if (!(e.exact ? e.rel_error == 0 : e.rel_error <= tolerance)) return false;
  return all_written && bitwise_identical;
}

LayerCheckResult run_layer_check(const LayerCheckOptions& o) {
  const LayerConfig& l = o.layer;
  l.validate();
  const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn;
  const int64_t T = o.tokens, TK = T * K;
  if (T <= 0) throw InvalidArgument("tokens", fmt::format("T = {} must be at least 1", T));
  const bool gated = is_gated(l.activation), router = l.router != RouterKind::none;
  const CudaDriver& drv = cuda_driver();

  CUdevice dev;
  MB_CU(drv.cuDeviceGet(&dev, 0));
  char dev_name[256] = {};
  MB_CU(drv.cuDeviceGetName(dev_name, sizeof dev_name, dev));
  int cc_major = 0, cc_minor = 0;
  MB_CU(drv.cuDeviceGetAttribute(&cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  MB_CU(drv.cuDeviceGetAttribute(&cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  const std::string arch = cc_major == 9 && cc_minor == 0 ? "sm_90a" : fmt::format("sm_{}{}", cc_major, cc_minor);
  LayerCheckResult res;
  std::optional<MoeLayer> built;
  if (o.cache || !o.force.empty()) {
    DeviceContext dc(0);
    LoadOptions lo;
    lo.tokens = T;
    lo.policy = o.policy;
    lo.force = o.force;
    LoadReport lr;
    built.emplace(std::make_shared<KernelSet>(load_kernels(l, dc.info(), o.cache, lo, &lr)));
    res.kernels = lr.summary();
    for (const auto& k : lr.kernels)
      if (k.tile_source != TileSource::default_tile) res.kernels += fmt::format("; {} {}", to_string(k.family), k.tile.to_string());
  } else {
    built.emplace(MoeLayer::build(l, arch));
    res.kernels = "default tiles, compiled now";
  }
  const MoeLayer& layer = *built;

  res.layer = l.describe();
  res.device = dev_name;
  res.tokens = T;
  res.plan = layer.memory_plan(T, o.mode);

  // ---- host data: random, scaled so activations stay O(1) --------------------------------
  const uint64_t s = o.seed;
  std::vector<bf16> x(T * d), w1(static_cast<size_t>(E) * n * d), w3(gated ? w1.size() : 0),
      w2(static_cast<size_t>(E) * d * n), dy(T * d), wr(router ? static_cast<size_t>(E) * d : 0);
  fill_uniform(x, 1.f, s * 16 + 1);
  fill_uniform(w1, std::sqrt(3.f / d), s * 16 + 2);
  if (gated) fill_uniform(w3, std::sqrt(3.f / d), s * 16 + 3);
  fill_uniform(w2, std::sqrt(3.f / n), s * 16 + 4);
  fill_uniform(dy, 1.f, s * 16 + 5);
  // A fused gate_up layer reads W1 and W3 from one [E,2n,d] tensor (each expert's W1 rows,
  // then its W3 rows) and writes dW1/dW3 the same way; the reference keeps them apart.
  const bool fused = l.fused_gate_up(), separate_w3 = gated && !fused;
  const size_t w1_rows = static_cast<size_t>(l.w1_rows()), nd = static_cast<size_t>(n) * d;
  std::vector<bf16> w13;
  if (fused) {
    w13.resize(static_cast<size_t>(E) * 2 * nd);
    for (int e = 0; e < E; ++e) {
      std::copy_n(w1.begin() + e * nd, nd, w13.begin() + 2 * e * nd);
      std::copy_n(w3.begin() + e * nd, nd, w13.begin() + (2 * e + 1) * nd);
    }
  }
  // Expert biases (GPT-OSS): [E, G*n] and [E, d], of the size of the projections' outputs.
  std::vector<bf16> b_up(l.expert_bias ? static_cast<size_t>(E) * l.gate_parts() * n : 0),
      b_down(l.expert_bias ? static_cast<size_t>(E) * d : 0);
  if (l.expert_bias) {
    fill_uniform(b_up, 0.5f, s * 16 + 16);
    fill_uniform(b_down, 0.5f, s * 16 + 17);
  }
  std::vector<float> bias;
  std::vector<int32_t> ids_in;
  std::vector<float> gates_in;
  if (router) {
    fill_uniform(wr, std::sqrt(3.f / d), s * 16 + 6);
    if (l.router == RouterKind::sigmoid_topk) {
      bias.resize(E);
      fill_uniform(bias, -0.05f, 0.05f, s * 16 + 7);
    }
  } else {
    draw_routing(to_string(o.routing), T, E, K, s * 16 + 8, ids_in, gates_in);
  }

  // ---- device buffers ---------------------------------------------------------------------
  auto upload = [](const auto& v) {
    DeviceBuffer b(v.size() * sizeof(v[0]));
    b.upload(v.data(), b.size());
    return b;
  };
  DeviceBuffer d_x = upload(x), d_w1 = upload(fused ? w13 : w1), d_w2 = upload(w2), d_dy = upload(dy);
  DeviceBuffer d_w3 = separate_w3 ? upload(w3) : DeviceBuffer();
  DeviceBuffer d_wr = router ? upload(wr) : DeviceBuffer();
  DeviceBuffer d_bias = bias.empty() ? DeviceBuffer() : upload(bias);
  DeviceBuffer d_b_up = b_up.empty() ? DeviceBuffer() : upload(b_up), d_b_down = b_down.empty() ? DeviceBuffer() : upload(b_down);
  DeviceBuffer d_db_up(b_up.size() * (o.accumulate_fp32 ? 4 : 2)), d_db_down(b_down.size() * (o.accumulate_fp32 ? 4 : 2));
  DeviceBuffer d_ids = router ? DeviceBuffer() : upload(ids_in);
  DeviceBuffer d_gates_in = router ? DeviceBuffer() : upload(gates_in);
  const size_t wbytes = o.accumulate_fp32 ? 4 : 2;
  DeviceBuffer d_y(T * d * 2), d_dx(T * d * 2), d_dw1(E * w1_rows * d * wbytes),
      d_dw3(separate_w3 ? w3.size() * wbytes : 0),
      d_dw2(w2.size() * wbytes), d_dwr(wr.size() * wbytes), d_dgates(TK * 4), d_gates_out(router ? TK * 4 : 0);
  DeviceBuffer saved(res.plan.saved_bytes), fscratch(res.plan.forward_scratch_bytes),
      bscratch(res.plan.backward_scratch_bytes);
  // fp32 accumulation starts from random contents: expected = initial + gradient.
  std::vector<float> acc_init1, acc_init3, acc_init2, acc_initr;
  if (o.accumulate_fp32) {
    acc_init1.resize(E * w1_rows * d);
    fill_uniform(acc_init1, -1.f, 1.f, s * 16 + 9);
    acc_init3.resize(separate_w3 ? w3.size() : 0);
    fill_uniform(acc_init3, -1.f, 1.f, s * 16 + 10);
    acc_init2.resize(w2.size());
    fill_uniform(acc_init2, -1.f, 1.f, s * 16 + 11);
    acc_initr.resize(wr.size());
    fill_uniform(acc_initr, -1.f, 1.f, s * 16 + 12);
  }

  auto tref = [](const DeviceBuffer& b, DType t, std::vector<int64_t> shape) {
    return TensorRef{b.get(), t, std::move(shape)};
  };
  const DType wt = o.accumulate_fp32 ? DType::f32 : DType::bf16;
  ForwardArgs fa;
  fa.x = tref(d_x, DType::bf16, {T, d});
  if (router) {
    fa.w_router = tref(d_wr, DType::bf16, {E, d});
    if (!bias.empty()) fa.router_bias = tref(d_bias, DType::f32, {E});
    fa.gates_out = tref(d_gates_out, DType::f32, {T, K});
  } else {
    fa.topk_ids = tref(d_ids, DType::i32, {T, K});
    fa.topk_weights = tref(d_gates_in, DType::f32, {T, K});
    fa.check_routing = true;
  }
  fa.w1 = tref(d_w1, DType::bf16, w1_shape(l));
  if (separate_w3) fa.w3 = tref(d_w3, DType::bf16, {E, n, d});
  fa.w2 = tref(d_w2, DType::bf16, {E, d, n});
  if (l.expert_bias) {
    fa.bias_up = tref(d_b_up, DType::bf16, {E, int64_t{l.gate_parts()} * n});
    fa.bias_down = tref(d_b_down, DType::bf16, {E, d});
  }
  fa.y = tref(d_y, DType::bf16, {T, d});
  fa.mode = o.mode;
  fa.saved = saved.get();
  fa.saved_bytes = saved.size();
  fa.scratch = fscratch.get();
  fa.scratch_bytes = fscratch.size();

  BackwardArgs ba;
  ba.dy = tref(d_dy, DType::bf16, {T, d});
  ba.x = fa.x;
  ba.topk_weights = fa.topk_weights;
  ba.w_router = fa.w_router;
  ba.router_bias = fa.router_bias;
  ba.w1 = fa.w1;
  ba.w3 = fa.w3;
  ba.w2 = fa.w2;
  ba.dx = tref(d_dx, DType::bf16, {T, d});
  ba.dw1 = tref(d_dw1, wt, w1_shape(l));
  if (separate_w3) ba.dw3 = tref(d_dw3, wt, {E, n, d});
  ba.dw2 = tref(d_dw2, wt, {E, d, n});
  ba.d_topk_weights = tref(d_dgates, DType::f32, {T, K});
  ba.bias_up = fa.bias_up;
  ba.bias_down = fa.bias_down;
  if (l.expert_bias) {
    ba.d_bias_up = tref(d_db_up, wt, {E, int64_t{l.gate_parts()} * n});
    ba.d_bias_down = tref(d_db_down, wt, {E, d});
  }
  if (router) ba.dw_router = tref(d_dwr, wt, {E, d});
  ba.scratch = bscratch.get();
  ba.scratch_bytes = bscratch.size();

  Stream stream;
  auto poison = [&](const DeviceBuffer& b, bool f32) {
    if (!b.size()) return;
    if (f32) MB_CU(drv.cuMemsetD32Async(b.get(), kPoisonF32, b.size() / 4, stream.get()));
    else MB_CU(drv.cuMemsetD8Async(b.get(), 0xff, b.size(), stream.get()));
    (void)kPoisonBf16;
  };
  auto reset_outputs = [&] {
    poison(d_y, false);
    poison(d_dx, false);
    poison(d_dgates, true);
    poison(d_gates_out, true);
    if (o.accumulate_fp32) {
      d_dw1.upload(acc_init1.data(), d_dw1.size());
      if (separate_w3) d_dw3.upload(acc_init3.data(), d_dw3.size());
      d_dw2.upload(acc_init2.data(), d_dw2.size());
      if (router) d_dwr.upload(acc_initr.data(), d_dwr.size());
      for (const DeviceBuffer* b : {&d_db_up, &d_db_down})  // bias gradients add from zero
        if (b->size()) MB_CU(drv.cuMemsetD32Async(b->get(), 0, b->size() / 4, stream.get()));
    } else {
      poison(d_dw1, false);
      poison(d_dw3, false);
      poison(d_dw2, false);
      poison(d_dwr, false);
      poison(d_db_up, false);
      poison(d_db_down, false);
    }
    poison(saved, false);
    poison(fscratch, false);
    poison(bscratch, false);
  };

  ForwardState state;
  Snapshot runs[2];
  for (int run = 0; run < 2; ++run) {
    reset_outputs();
    Event e0, e1, e2;
    e0.record(stream.get());
    state = layer.forward(fa, stream.get());
    e1.record(stream.get());
    if (o.backward) layer.backward(state, ba, stream.get());
    e2.record(stream.get());
    stream.synchronize();
    res.forward_ms = Event::elapsed_ms(e0, e1);
    res.backward_ms = o.backward ? Event::elapsed_ms(e1, e2) : 0;
    Snapshot& snap = runs[run];
    snap.add("y", d_y.get(), d_y.size());
    snap.add("index arrays", saved.get(), res.plan.index_bytes);
    if (state.H) snap.add(o.backward ? "dH (over the saved H)" : "H", state.H, res.plan.h_floor_bytes);
    if (router) snap.add("gates", d_gates_out.get(), d_gates_out.size());
    if (o.backward) {
      snap.add("dx", d_dx.get(), d_dx.size());
      snap.add("dw1", d_dw1.get(), d_dw1.size());
      if (separate_w3) snap.add("dw3", d_dw3.get(), d_dw3.size());
      snap.add("dw2", d_dw2.get(), d_dw2.size());
      snap.add("d_topk_weights", d_dgates.get(), d_dgates.size());
      if (router) snap.add("dw_router", d_dwr.get(), d_dwr.size());
      if (l.expert_bias) {
        snap.add("d_bias_up", d_db_up.get(), d_db_up.size());
        snap.add("d_bias_down", d_db_down.get(), d_db_down.size());
      }
    }
  }
  for (size_t i = 0; i < runs[0].parts.size(); ++i)
    if (runs[0].parts[i].second != runs[1].parts[i].second) {
      res.bitwise_identical = false;
      res.differs += (res.differs.empty() ? "" : ", ") + runs[0].parts[i].first;
    }
  res.peak_bytes = res.plan.saved_bytes + std::max(res.plan.forward_scratch_bytes, res.plan.backward_scratch_bytes) +
                   d_y.size() + (o.backward ? d_dx.size() : 0);

  // ---- compare with the reference ------------------------------------------------------
  auto note_unwritten = [&](const std::string& name, bool bad) {
    if (!bad) return;
    res.all_written = false;
    res.unwritten += (res.unwritten.empty() ? "" : ", ") + name;
  };
  const std::vector<int32_t> ids = download_ptr<int32_t>(state.token_expert_indices, TK);
  // Index arrays: exact, from the GPU's picks.
  {
    const reference::IndexArrays ref = reference::build_index(ids.data(), T, K, E);
    const bool same = ref.expert_token_indices == download_ptr<int32_t>(state.expert_token_indices, TK) &&
                      ref.expert_token_offsets == download_ptr<int32_t>(state.expert_token_offsets, E + 1) &&
                      ref.token_expert_indices == ids &&
                      ref.token_index_map == download_ptr<int32_t>(state.token_index_map, TK);
    res.errors.push_back({"index arrays", same ? 0.0 : 1.0, TK * 3 + E + 1, true});
    const auto counts = download_ptr<int32_t>(state.expert_counts, E);
    bool counts_ok = true;
    for (int e = 0; e < E; ++e) counts_ok &= counts[e] == ref.expert_token_offsets[e + 1] - ref.expert_token_offsets[e];
    res.errors.push_back({"expert counts", counts_ok ? 0.0 : 1.0, E, true});
    const auto [mn, mx] = std::minmax_element(counts.begin(), counts.end());
    res.expert_counts_min_max = {*mn, *mx};
  }
  // Gates: the caller's, or the reference router's for the GPU's picks.
  reference::RouterSpec spec{l.router, l.renormalize, l.route_scale};
  std::vector<double> logits, gates_ref(TK);
  if (router) {
    logits = reference::router_logits(x.data(), wr.data(), T, d, E);
    gates_ref = reference::gates_for(spec, logits.data(), ids.data(), T, E, K);
    const auto gates_gpu = download<float>(d_gates_out, TK);
    note_unwritten("gates", has_poison(gates_gpu));
    std::vector<double> g(gates_gpu.begin(), gates_gpu.end());
    res.errors.push_back({"gates", reference::relative_error(g.data(), gates_ref.data(), TK), TK, false});
    // Picks: every picked key at least every unpicked key (up to GPU logit rounding).
    int64_t wrong = 0;
    for (int64_t t = 0; t < T; ++t) {
      const double* lg = logits.data() + t * E;
      double mx = -INFINITY, sum = 0;
      for (int e = 0; e < E; ++e) mx = std::max(mx, lg[e]);
      for (int e = 0; e < E; ++e) sum += std::exp(lg[e] - mx);
      auto key = [&](int e) {
        return l.router == RouterKind::softmax_topk ? std::exp(lg[e] - mx) / sum
                                                    : 1.0 / (1.0 + std::exp(-lg[e])) + (bias.empty() ? 0.0 : bias[e]);
      };
      double min_picked = INFINITY, max_other = -INFINITY;
      std::set<int> picked(ids.begin() + t * K, ids.begin() + (t + 1) * K);
      for (int e = 0; e < E; ++e) (picked.count(e) ? min_picked = std::min(min_picked, key(e))
                                                   : max_other = std::max(max_other, key(e)));
      if (min_picked < max_other - 1e-4 * std::max(1.0, std::abs(max_other))) ++wrong;
    }
    res.errors.push_back({"router picks", wrong ? static_cast<double>(wrong) / T : 0.0, T, true});
  } else {
    for (int64_t i = 0; i < TK; ++i) gates_ref[i] = gates_in[i];
  }

  // Sampled tokens (all when T is small), first and last always in.
  std::vector<int64_t> tokens;
  if (T <= o.sample_tokens) {
    tokens.resize(T);
    std::iota(tokens.begin(), tokens.end(), 0);
  } else {
    std::set<int64_t> pick = {0, T - 1};
    for (uint64_t i = 0; static_cast<int>(pick.size()) < o.sample_tokens; ++i)
      pick.insert(static_cast<int64_t>(unit_double(s * 16 + 13, i) * T));
    tokens.assign(pick.begin(), pick.end());
  }
  reference::ExpertWeights rw{w1.data(), gated ? w3.data() : nullptr, w2.data(), E, d, n, l.activation,
                              l.expert_bias ? b_up.data() : nullptr, l.expert_bias ? b_down.data() : nullptr};
  const auto y_gpu = download<bf16>(d_y, T * d);
  note_unwritten("y", has_poison(y_gpu));
  {
    const auto ref = reference::forward_rows(rw, x.data(), ids.data(), gates_ref.data(), K, tokens);
    std::vector<bf16> got;
    for (int64_t t : tokens) got.insert(got.end(), y_gpu.begin() + t * d, y_gpu.begin() + (t + 1) * d);
    res.errors.push_back({"y", rel_error_bf16(got, ref), static_cast<int64_t>(got.size()), false});
  }
  if (!o.backward) return res;

  const auto tg = reference::backward_rows(rw, x.data(), dy.data(), ids.data(), gates_ref.data(), K, tokens);
  const auto dgates_gpu = download<float>(d_dgates, TK);
  note_unwritten("d_topk_weights", has_poison(dgates_gpu));
  {
    std::vector<double> got;
    for (int64_t t : tokens)
      for (int j = 0; j < K; ++j) got.push_back(dgates_gpu[t * K + j]);
    res.errors.push_back({"d_topk_weights", reference::relative_error(got.data(), tg.d_gates.data(), got.size()),
                          static_cast<int64_t>(got.size()), false});
  }
  {
    std::vector<double> ref = tg.dx;
    if (router) {
      // Router part of dx for the sampled tokens, from the reference gate gradients.
      std::vector<double> lg_rows, ids_rows_d;
      std::vector<int32_t> ids_rows;
      for (int64_t t : tokens) {
        lg_rows.insert(lg_rows.end(), logits.begin() + t * E, logits.begin() + (t + 1) * E);
        ids_rows.insert(ids_rows.end(), ids.begin() + t * K, ids.begin() + (t + 1) * K);
      }
      const int64_t ns = static_cast<int64_t>(tokens.size());
      const auto dl = reference::router_logits_grad(spec, lg_rows.data(), ids_rows.data(), tg.d_gates.data(), ns, E, K);
      std::vector<int64_t> rows(ns);
      std::iota(rows.begin(), rows.end(), 0);
      const auto rdx = reference::router_dx_rows(dl.data(), wr.data(), E, d, rows);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += rdx[i];
    }
    const auto dx_gpu = download<bf16>(d_dx, T * d);
    note_unwritten("dx", has_poison(dx_gpu));
    std::vector<bf16> got;
    for (int64_t t : tokens) got.insert(got.end(), dx_gpu.begin() + t * d, dx_gpu.begin() + (t + 1) * d);
    res.errors.push_back({"dx", rel_error_bf16(got, ref), static_cast<int64_t>(got.size()), false});
  }
  // Weight gradients of sampled experts: the busiest, the least busy non-empty one, random
  // ones, and an expert without tokens (must be exactly zero) when there is one.
  {
    std::vector<int64_t> cnt(E, 0);
    for (int32_t e : ids) ++cnt[e];
    std::set<int> experts;
    experts.insert(static_cast<int>(std::max_element(cnt.begin(), cnt.end()) - cnt.begin()));
    int least = -1;
    for (int e = 0; e < E; ++e)
      if (cnt[e] > 0 && (least < 0 || cnt[e] < cnt[least])) least = e;
    experts.insert(least);
    for (uint64_t i = 0; static_cast<int>(experts.size()) < std::min(o.sample_experts, E); ++i)
      experts.insert(static_cast<int>(unit_double(s * 16 + 14, i) * E));
    for (int e = 0; e < E; ++e)
      if (cnt[e] == 0) {
        experts.insert(e);
        break;
      }
    auto grad_rows = [&](const DeviceBuffer& b, const std::vector<float>& init, size_t offset, size_t count) {
      std::vector<double> g(count);
      if (o.accumulate_fp32) {
        const auto v = download<float>(b, count, offset * 4);
        for (size_t i = 0; i < count; ++i) g[i] = static_cast<double>(v[i]) - init[offset + i];
        note_unwritten("weight gradients", has_poison(v));
      } else {
        const auto v = download<bf16>(b, count, offset * 2);
        for (size_t i = 0; i < count; ++i) g[i] = to_float(v[i]);
        note_unwritten("weight gradients", has_poison(v));
      }
      return g;
    };
    std::vector<double> got1, ref1, got3, ref3, got2, ref2, got_bu, ref_bu, got_bd, ref_bd;
    std::string names;
    // FFN rows compared per expert: all of them for small n, else a sample (first and last in).
    std::vector<int> rows;
    if (n <= 128) {
      for (int i = 0; i < n; ++i) rows.push_back(i);
    } else {
      std::set<int> r = {0, n - 1};
      for (uint64_t i = 0; r.size() < 64; ++i) r.insert(static_cast<int>(unit_double(s * 16 + 15, i) * n));
      rows.assign(r.begin(), r.end());
    }
    const int64_t R = static_cast<int64_t>(rows.size());
    auto append = [](std::vector<double>& a, const std::vector<double>& b) { a.insert(a.end(), b.begin(), b.end()); };
    for (int e : experts) {
      names += (names.empty() ? "" : ",") + std::to_string(e);
      const auto eg =
          reference::expert_weight_grad_rows(rw, x.data(), dy.data(), ids.data(), gates_ref.data(), T, K, e, rows);
      const size_t w1_e = e * w1_rows * d;  // expert e's first W1 element
      for (int i : rows) {  // rows i of dW1 and dW3
        append(got1, grad_rows(d_dw1, acc_init1, w1_e + static_cast<size_t>(i) * d, d));
        if (separate_w3) append(got3, grad_rows(d_dw3, acc_init3, e * nd + static_cast<size_t>(i) * d, d));
        if (fused) append(got3, grad_rows(d_dw1, acc_init1, w1_e + static_cast<size_t>(n + i) * d, d));
      }
      append(ref1, eg.dw1);
      if (gated) append(ref3, eg.dw3);
      if (l.expert_bias) {  // the biases' gradients of the expert: its sampled rows, all of d_bias_down
        // (fp32 accumulation starts these from zero: the contents are not initialised above)
        const std::vector<float> zero_up(b_up.size(), 0.f), zero_down(b_down.size(), 0.f);
        const size_t gn = static_cast<size_t>(l.gate_parts()) * n;
        for (int part = 0; part < l.gate_parts(); ++part)
          for (int i : rows) append(got_bu, grad_rows(d_db_up, zero_up, e * gn + part * n + i, 1));
        append(ref_bu, eg.d_bias_up);
        append(got_bd, grad_rows(d_db_down, zero_down, static_cast<size_t>(e) * d, d));
        append(ref_bd, eg.d_bias_down);
      }
      // Columns i of dW2 [d, n]: read whole rows c, keep the sampled columns.
      const auto w2e = grad_rows(d_dw2, acc_init2, e * nd, nd);
      for (int64_t c = 0; c < d; ++c)
        for (int64_t r = 0; r < R; ++r) got2.push_back(w2e[c * n + rows[r]]);
      append(ref2, eg.dw2);
      if (cnt[e] == 0) {  // exact zeros expected
        const auto g1 = grad_rows(d_dw1, acc_init1, w1_e, w1_rows * d);  // fused: dW3 too
        const bool zero = std::all_of(g1.begin(), g1.end(), [](double v) { return v == 0.0; }) &&
                          std::all_of(w2e.begin(), w2e.end(), [](double v) { return v == 0.0; });
        res.errors.push_back({fmt::format("dW1, dW2 of empty expert {} are zero", e), zero ? 0.0 : 1.0,
                              static_cast<int64_t>(2 * nd), true});
      }
    }
    names += fmt::format("; {} of {} rows", R, n);
    res.errors.push_back({"dW1 (experts " + names + ")", reference::relative_error(got1.data(), ref1.data(), got1.size()),
                          static_cast<int64_t>(got1.size()), false});
    if (gated)
      res.errors.push_back({"dW3 (experts " + names + ")",
                            reference::relative_error(got3.data(), ref3.data(), got3.size()),
                            static_cast<int64_t>(got3.size()), false});
    res.errors.push_back({"dW2 (experts " + names + ")", reference::relative_error(got2.data(), ref2.data(), got2.size()),
                          static_cast<int64_t>(got2.size()), false});
    if (l.expert_bias) {
      res.errors.push_back({"d_bias_up (experts " + names + ")",
                            reference::relative_error(got_bu.data(), ref_bu.data(), got_bu.size()),
                            static_cast<int64_t>(got_bu.size()), false});
      res.errors.push_back({"d_bias_down (experts " + names + ")",
                            reference::relative_error(got_bd.data(), ref_bd.data(), got_bd.size()),
                            static_cast<int64_t>(got_bd.size()), false});
    }
  }
  if (router) {
    // dW_r over all tokens, from the GPU's gate gradients (themselves checked above).
    std::vector<double> dg(dgates_gpu.begin(), dgates_gpu.end());
    const auto dl = reference::router_logits_grad(spec, logits.data(), ids.data(), dg.data(), T, E, K);
    const auto ref = reference::router_weight_grad(dl.data(), x.data(), T, E, d);
    std::vector<float> none;
    std::vector<double> got(static_cast<size_t>(E) * d);
    if (o.accumulate_fp32) {
      const auto v = download<float>(d_dwr, got.size());
      for (size_t i = 0; i < got.size(); ++i) got[i] = static_cast<double>(v[i]) - acc_initr[i];
    } else {
      const auto v = download<bf16>(d_dwr, got.size());
      note_unwritten("dw_router", has_poison(v));
      for (size_t i = 0; i < got.size(); ++i) got[i] = to_float(v[i]);
    }
    res.errors.push_back({"dW_router", reference::relative_error(got.data(), ref.data(), got.size()),
                          static_cast<int64_t>(got.size()), false});
  }
  return res;
}

}  // namespace moeblaze
