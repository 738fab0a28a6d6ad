// The layer check, run side: load the kernels, draw inputs, run forward (+ backward) twice
// on poisoned outputs, hash everything written for the bitwise comparison. The comparison
// with the CPU reference is layer_check_compare.cpp.
#include "layer_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "host_data.hpp"
#include "layer_check_detail.hpp"
#include "runtime/kernel_loader.hpp"

namespace moeblaze {
namespace {

using detail::CheckBuffers;
using detail::CheckData;
using detail::CheckInputs;

constexpr uint32_t kPoisonF32 = 0xffffffffu;  // a NaN; bf16 outputs are filled with 0xff bytes (NaN too)

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

// ---- step 1: the layer's kernels -------------------------------------------------------

// Default tiles compiled now, or (with a cache or forced tiles) what the runtime would load;
// `kernels` says which.
MoeLayer load_layer(const LayerCheckOptions& o, const DeviceInfo& device, std::string& kernels) {
  if (!o.cache && o.force.empty()) {
    kernels = "default tiles, compiled now";
    return MoeLayer::build(o.layer, device.arch());
  }
  LoadOptions lo;
  lo.tokens = o.tokens;
  lo.policy = o.policy;
  lo.force = o.force;
  lo.tuned = o.tuned;
  LoadReport lr;
  MoeLayer layer(std::make_shared<KernelSet>(load_kernels(o.layer, device, o.cache, lo, &lr)));
  kernels = lr.summary();
  for (const auto& k : lr.kernels)
    if (k.tile_source != TileSource::default_tile) kernels += fmt::format("; {} {}", to_string(k.family), k.tile.to_string());
  return layer;
}

// ---- step 2: inputs on the host and on the device ---------------------------------------

CheckInputs draw_inputs(const CheckData& c) {
  const LayerCheckOptions& o = c.options;
  const uint64_t s = o.seed;
  CheckInputs in;
  in.x.resize(c.T * c.d);
  in.w1.resize(static_cast<size_t>(c.E) * c.n * c.d);
  in.w3.resize(c.gated ? in.w1.size() : 0);
  in.w2.resize(static_cast<size_t>(c.E) * c.d * c.n);
  in.dy.resize(c.T * c.d);
  in.wr.resize(c.router ? static_cast<size_t>(c.E) * c.d : 0);
  fill_uniform(in.x, 1.f, s * 16 + 1);
  fill_uniform(in.w1, std::sqrt(3.f / c.d), s * 16 + 2);
  if (c.gated) fill_uniform(in.w3, std::sqrt(3.f / c.d), s * 16 + 3);
  fill_uniform(in.w2, std::sqrt(3.f / c.n), s * 16 + 4);
  fill_uniform(in.dy, 1.f, s * 16 + 5);
  if (c.fused) {
    const size_t nd = static_cast<size_t>(c.n) * c.d;
    in.w13.resize(static_cast<size_t>(c.E) * 2 * nd);
    for (int e = 0; e < c.E; ++e) {
      std::copy_n(in.w1.begin() + e * nd, nd, in.w13.begin() + 2 * e * nd);
      std::copy_n(in.w3.begin() + e * nd, nd, in.w13.begin() + (2 * e + 1) * nd);
    }
  }
  // Expert biases (GPT-OSS), of the size of the projections' outputs.
  if (o.layer.expert_bias) {
    in.b_up.resize(static_cast<size_t>(c.E) * o.layer.gate_parts() * c.n);
    in.b_down.resize(static_cast<size_t>(c.E) * c.d);
    fill_uniform(in.b_up, 0.5f, s * 16 + 16);
    fill_uniform(in.b_down, 0.5f, s * 16 + 17);
  }
  if (c.router) {
    fill_uniform(in.wr, std::sqrt(3.f / c.d), s * 16 + 6);
    if (o.layer.router == RouterKind::sigmoid_topk) {
      in.bias.resize(c.E);
      fill_uniform(in.bias, -0.05f, 0.05f, s * 16 + 7);
    }
  } else {
    draw_routing(to_string(o.routing), c.T, c.E, c.K, s * 16 + 8, in.ids, in.gates);
    if (!o.bad_ids.empty()) {
      in.device_ids = in.ids;
      in.device_gates = in.gates;
      for (const auto& [slot, id] : o.bad_ids) {
        if (slot < 0 || slot >= c.T * c.K)
          throw InvalidArgument("bad_ids", fmt::format("slot {} is outside [0, T*K = {})", slot, c.T * c.K));
        if (id >= 0 && id < c.E) throw InvalidArgument("bad_ids", fmt::format("id {} is inside [0, {})", id, c.E));
        in.device_ids[slot] = id;
        in.device_gates[slot] = std::numeric_limits<float>::quiet_NaN();
        in.gates[slot] = 0.f;  // the reference without the pick: same y, dx and weight gradients
      }
    }
  }
  // fp32 accumulation starts from random contents: expected = initial + gradient.
  if (o.accumulate_fp32) {
    auto fill = [](std::vector<float>& v, size_t count, uint64_t seed) {
      v.resize(count);
      fill_uniform(v, -1.f, 1.f, seed);
    };
    fill(in.acc1, static_cast<size_t>(c.E) * c.w1_rows * c.d, s * 16 + 9);
    fill(in.acc3, c.separate_w3 ? in.w3.size() : 0, s * 16 + 10);
    fill(in.acc2, in.w2.size(), s * 16 + 11);
    fill(in.accr, in.wr.size(), s * 16 + 12);
  }
  return in;
}

template <class V>
DeviceBuffer upload(const V& v) {
  DeviceBuffer b(v.size() * sizeof(v[0]));
  b.upload(v.data(), b.size());
  return b;
}

CheckBuffers allocate_buffers(const CheckData& c, const MemoryPlan& plan) {
  const CheckInputs& in = c.in;
  const int64_t TK = c.T * c.K;
  const size_t wbytes = c.options.accumulate_fp32 ? 4 : 2;
  CheckBuffers b;
  b.x = upload(in.x);
  b.w1 = upload(c.fused ? in.w13 : in.w1);
  b.w2 = upload(in.w2);
  b.dy = upload(in.dy);
  if (c.separate_w3) b.w3 = upload(in.w3);
  if (c.router) b.wr = upload(in.wr);
  if (!in.bias.empty()) b.bias = upload(in.bias);
  if (!in.b_up.empty()) {
    b.b_up = upload(in.b_up);
    b.b_down = upload(in.b_down);
  }
  b.db_up = DeviceBuffer(in.b_up.size() * wbytes);
  b.db_down = DeviceBuffer(in.b_down.size() * wbytes);
  if (!c.router) {
    b.ids = upload(in.device_ids.empty() ? in.ids : in.device_ids);
    b.gates_in = upload(in.device_gates.empty() ? in.gates : in.device_gates);
  }
  b.y = DeviceBuffer(c.T * c.d * 2);
  b.dx = DeviceBuffer(c.T * c.d * 2);
  b.dw1 = DeviceBuffer(static_cast<size_t>(c.E) * c.w1_rows * c.d * wbytes);
  b.dw3 = DeviceBuffer(c.separate_w3 ? in.w3.size() * wbytes : 0);
  b.dw2 = DeviceBuffer(in.w2.size() * wbytes);
  b.dwr = DeviceBuffer(in.wr.size() * wbytes);
  b.dgates = DeviceBuffer(TK * 4);
  b.gates_out = DeviceBuffer(c.router ? TK * 4 : 0);
  b.saved = DeviceBuffer(plan.saved_bytes);
  b.fscratch = DeviceBuffer(plan.forward_scratch_bytes);
  b.bscratch = DeviceBuffer(plan.backward_scratch_bytes);
  return b;
}

TensorRef tensor(const DeviceBuffer& b, DType t, std::vector<int64_t> shape) {
  return TensorRef{b.get(), t, std::move(shape)};
}

ForwardArgs forward_args(const CheckData& c) {
  const CheckBuffers& b = c.buf;
  const int64_t T = c.T, E = c.E, K = c.K, d = c.d, n = c.n;
  ForwardArgs fa;
  fa.x = tensor(b.x, DType::bf16, {T, d});
  if (c.router) {
    fa.w_router = tensor(b.wr, DType::bf16, {E, d});
    if (!c.in.bias.empty()) fa.router_bias = tensor(b.bias, DType::f32, {E});
    fa.gates_out = tensor(b.gates_out, DType::f32, {T, K});
  } else {
    fa.topk_ids = tensor(b.ids, DType::i32, {T, K});
    fa.topk_weights = tensor(b.gates_in, DType::f32, {T, K});
    fa.check_routing = c.options.bad_ids.empty();  // bad ids on purpose: left out, not raised
  }
  fa.w1 = tensor(b.w1, DType::bf16, w1_shape(c.options.layer));
  if (c.separate_w3) fa.w3 = tensor(b.w3, DType::bf16, {E, n, d});
  fa.w2 = tensor(b.w2, DType::bf16, {E, d, n});
  if (c.options.layer.expert_bias) {
    fa.bias_up = tensor(b.b_up, DType::bf16, {E, int64_t{c.options.layer.gate_parts()} * n});
    fa.bias_down = tensor(b.b_down, DType::bf16, {E, d});
  }
  fa.y = tensor(b.y, DType::bf16, {T, d});
  fa.mode = c.options.mode;
  fa.saved = b.saved.get();
  fa.saved_bytes = b.saved.size();
  fa.scratch = b.fscratch.get();
  fa.scratch_bytes = b.fscratch.size();
  return fa;
}

BackwardArgs backward_args(const CheckData& c, const ForwardArgs& fa) {
  const CheckBuffers& b = c.buf;
  const int64_t T = c.T, E = c.E, K = c.K, d = c.d, n = c.n;
  const DType wt = c.options.accumulate_fp32 ? DType::f32 : DType::bf16;
  BackwardArgs ba;
  ba.dy = tensor(b.dy, DType::bf16, {T, d});
  ba.x = fa.x;
  ba.topk_weights = fa.topk_weights;
  ba.w_router = fa.w_router;
  ba.router_bias = fa.router_bias;
  ba.w1 = fa.w1;
  ba.w3 = fa.w3;
  ba.w2 = fa.w2;
  ba.dx = tensor(b.dx, DType::bf16, {T, d});
  ba.dw1 = tensor(b.dw1, wt, w1_shape(c.options.layer));
  if (c.separate_w3) ba.dw3 = tensor(b.dw3, wt, {E, n, d});
  ba.dw2 = tensor(b.dw2, wt, {E, d, n});
  ba.d_topk_weights = tensor(b.dgates, DType::f32, {T, K});
  ba.bias_up = fa.bias_up;
  ba.bias_down = fa.bias_down;
  if (c.options.layer.expert_bias) {
    ba.d_bias_up = tensor(b.db_up, wt, {E, int64_t{c.options.layer.gate_parts()} * n});
    ba.d_bias_down = tensor(b.db_down, wt, {E, d});
  }
  if (c.router) ba.dw_router = tensor(b.dwr, wt, {E, d});
  ba.scratch = b.bscratch.get();
  ba.scratch_bytes = b.bscratch.size();
  return ba;
}

// ---- step 3: two runs on poisoned outputs, compared bitwise ---------------------------

// Every output NaN (every element must be written), the fp32 gradients their initial
// contents, the saved state and scratch NaN too (nothing may read what it did not write).
void reset_outputs(CheckData& c, const Stream& stream) {
  const CudaDriver& drv = cuda_driver();
  CheckBuffers& b = c.buf;
  auto poison = [&](const DeviceBuffer& buf, bool f32) {
    if (!buf.size()) return;
    if (f32) MB_CU(drv.cuMemsetD32Async(buf.get(), kPoisonF32, buf.size() / 4, stream.get()));
    else MB_CU(drv.cuMemsetD8Async(buf.get(), 0xff, buf.size(), stream.get()));
  };
  poison(b.y, false);
  poison(b.dx, false);
  poison(b.dgates, true);
  poison(b.gates_out, true);
  if (c.options.accumulate_fp32) {
    b.dw1.upload(c.in.acc1.data(), b.dw1.size());
    if (c.separate_w3) b.dw3.upload(c.in.acc3.data(), b.dw3.size());
    b.dw2.upload(c.in.acc2.data(), b.dw2.size());
    if (c.router) b.dwr.upload(c.in.accr.data(), b.dwr.size());
    for (const DeviceBuffer* g : {&b.db_up, &b.db_down})  // bias gradients add from zero
      if (g->size()) MB_CU(drv.cuMemsetD32Async(g->get(), 0, g->size() / 4, stream.get()));
  } else {
    poison(b.dw1, false);
    poison(b.dw3, false);
    poison(b.dw2, false);
    poison(b.dwr, false);
    poison(b.db_up, false);
    poison(b.db_down, false);
  }
  poison(b.saved, false);
  poison(b.fscratch, false);
  poison(b.bscratch, false);
}

Snapshot snapshot(const CheckData& c, const MemoryPlan& plan) {
  const CheckBuffers& b = c.buf;
  const bool backward = c.options.backward;
  Snapshot snap;
  snap.add("y", b.y.get(), b.y.size());
  snap.add("index arrays", b.saved.get(), plan.index_bytes);
  if (c.state.H) snap.add(backward ? "dH (over the saved H)" : "H", c.state.H, plan.h_floor_bytes);
  if (c.router) snap.add("gates", b.gates_out.get(), b.gates_out.size());
  if (backward) {
    snap.add("dx", b.dx.get(), b.dx.size());
    snap.add("dw1", b.dw1.get(), b.dw1.size());
    if (c.separate_w3) snap.add("dw3", b.dw3.get(), b.dw3.size());
    snap.add("dw2", b.dw2.get(), b.dw2.size());
    snap.add("d_topk_weights", b.dgates.get(), b.dgates.size());
    if (c.router) snap.add("dw_router", b.dwr.get(), b.dwr.size());
    if (c.options.layer.expert_bias) {
      snap.add("d_bias_up", b.db_up.get(), b.db_up.size());
      snap.add("d_bias_down", b.db_down.get(), b.db_down.size());
    }
  }
  return snap;
}

// Runs the layer twice; the second run's times are reported, its state kept in c.state.
void run_twice(const MoeLayer& layer, CheckData& c, LayerCheckResult& res) {
  const ForwardArgs fa = forward_args(c);
  const BackwardArgs ba = backward_args(c, fa);
  Stream stream;
  Snapshot runs[2];
  for (Snapshot& snap : runs) {
    reset_outputs(c, stream);
    Event e0, e1, e2;
    e0.record(stream.get());
    c.state = layer.forward(fa, stream.get());
    e1.record(stream.get());
    if (c.options.backward) layer.backward(c.state, ba, stream.get());
    e2.record(stream.get());
    stream.synchronize();
    res.forward_ms = Event::elapsed_ms(e0, e1);
    res.backward_ms = c.options.backward ? Event::elapsed_ms(e1, e2) : 0;
    snap = snapshot(c, res.plan);
  }
  for (size_t i = 0; i < runs[0].parts.size(); ++i)
    if (runs[0].parts[i].second != runs[1].parts[i].second) {
      res.bitwise_identical = false;
      res.differs += (res.differs.empty() ? "" : ", ") + runs[0].parts[i].first;
    }
}

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
  if (o.tokens <= 0) throw InvalidArgument("tokens", fmt::format("T = {} must be at least 1", o.tokens));
  if (!o.bad_ids.empty() && l.router != RouterKind::none)
    throw InvalidArgument("bad_ids", "needs caller routing (a built-in router picks valid ids)");
  // The caller's (primary) context, held until every buffer and module of the check is gone.
  const DeviceContext device(0);
  const bool gated = is_gated(l.activation);
  CheckData c{o,     l.shape.experts, l.shape.topk, l.shape.hidden, l.shape.ffn, o.tokens, gated,
              l.router != RouterKind::none, l.fused_gate_up(), gated && !l.fused_gate_up(),
              static_cast<size_t>(l.w1_rows()), {}, {}, {}};

  LayerCheckResult res;
  const MoeLayer layer = load_layer(o, device.info(), res.kernels);
  res.layer = l.describe();
  res.device = device.info().name;
  res.tokens = c.T;
  res.plan = layer.memory_plan(c.T, o.mode);
  res.peak_bytes = peak_bytes(res.plan, l, c.T, o.backward);

  c.in = draw_inputs(c);
  c.buf = allocate_buffers(c, res.plan);
  run_twice(layer, c, res);

  const std::vector<int32_t> ids = detail::compare_index_arrays(c, res);
  std::vector<double> logits;
  const std::vector<double> gates = detail::compare_router(c, ids, logits, res);
  const std::vector<int64_t> tokens = detail::sample_tokens(c);
  detail::compare_forward(c, ids, gates, tokens, res);
  if (o.backward) detail::compare_backward(c, ids, gates, logits, tokens, res);
  return res;
}

}  // namespace moeblaze
