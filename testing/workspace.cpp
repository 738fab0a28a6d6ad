#include "workspace.hpp"

#include <algorithm>
#include <cmath>

#include "host_data.hpp"

namespace moeblaze {
namespace {

DeviceBuffer random_bf16(size_t count, float scale, uint64_t seed) {
  std::vector<bf16> h(count);
  fill_uniform(h, scale, seed);
  DeviceBuffer b(count * 2);
  b.upload(h.data(), b.size());
  return b;
}

}  // namespace

LayerConfig timing_layer(const LayerConfig& layer, const std::string& routing) {
  LayerConfig l = layer;
  if (routing != "router") l.router = RouterKind::none;
  return l;
}

TimingWorkspace::TimingWorkspace(const LayerConfig& layer_in, int64_t T, const std::string& routing,
                                 CheckpointMode m, uint64_t seed, int64_t l2_bytes)
    : layer(timing_layer(layer_in, routing)), tokens(T), mode(m) {
  if (routing != "router" && routing != "random" && routing != "balanced" && routing != "skewed")
    throw InvalidArgument("routing", "'" + routing + "' is not one of router, random, balanced, skewed");
  const int E = layer.shape.experts, K = layer.shape.topk, d = layer.shape.hidden, n = layer.shape.ffn;
  const bool gated = is_gated(layer.activation);
  plan = plan_memory(layer, T, mode, 128);  // generous: the default dgrad tile is the smallest bn in use
  plan.backward_scratch_bytes = std::max(plan.backward_scratch_bytes, plan_memory(layer, T, mode, 64).backward_scratch_bytes);
  const int64_t act_bytes = T * d * 2 * 2;
  const int rot = static_cast<int>(std::clamp<int64_t>((2 * l2_bytes + act_bytes - 1) / std::max<int64_t>(act_bytes, 1), 1, 4));
  for (int r = 0; r < rot; ++r) {
    x.push_back(random_bf16(T * d, 1.f, seed * 100 + r));
    dy.push_back(random_bf16(T * d, 1.f, seed * 100 + 50 + r));
  }
  // A fused gate_up holds W1 and W3 in w1 ([E,2n,d]).
  const bool separate_w3 = gated && !layer.fused_gate_up();
  w1 = random_bf16(size_t(E) * layer.w1_rows() * d, std::sqrt(3.f / d), seed * 100 + 90);
  if (separate_w3) w3 = random_bf16(size_t(E) * n * d, std::sqrt(3.f / d), seed * 100 + 91);
  w2 = random_bf16(size_t(E) * d * n, std::sqrt(3.f / n), seed * 100 + 92);
  if (layer.expert_bias) {
    bias_up = random_bf16(size_t(E) * layer.gate_parts() * n, 0.5f, seed * 100 + 95);
    bias_down = random_bf16(size_t(E) * d, 0.5f, seed * 100 + 96);
    dbias_up = DeviceBuffer(bias_up.size());
    dbias_down = DeviceBuffer(bias_down.size());
  }
  if (layer.router != RouterKind::none) {
    wr = random_bf16(size_t(E) * d, std::sqrt(3.f / d), seed * 100 + 93);
  } else {
    // Caller routing drawn on the host (the same draw as the layer check). "router" on a
    // layer without a built-in router means random caller routing.
    std::vector<int32_t> hid;
    std::vector<float> hg;
    draw_routing(routing == "router" ? "random" : routing, T, E, K, seed * 100 + 94, hid, hg);
    ids = DeviceBuffer(hid.size() * 4);
    ids.upload(hid.data(), ids.size());
    gates = DeviceBuffer(hg.size() * 4);
    gates.upload(hg.data(), gates.size());
  }
  y = DeviceBuffer(T * d * 2);
  dx = DeviceBuffer(T * d * 2);
  dw1 = DeviceBuffer(size_t(E) * layer.w1_rows() * d * 2);
  if (separate_w3) dw3 = DeviceBuffer(size_t(E) * n * d * 2);
  dw2 = DeviceBuffer(size_t(E) * d * n * 2);
  if (layer.router != RouterKind::none) dwr = DeviceBuffer(size_t(E) * d * 2);
  dgates = DeviceBuffer(T * K * 4);
  saved = DeviceBuffer(plan.saved_bytes);
  fscratch = DeviceBuffer(plan.forward_scratch_bytes);
  bscratch = DeviceBuffer(plan.backward_scratch_bytes);
}

ForwardArgs TimingWorkspace::forward_args(int r) const {
  const int E = layer.shape.experts, K = layer.shape.topk, d = layer.shape.hidden, n = layer.shape.ffn;
  const int64_t T = tokens;
  ForwardArgs a;
  a.x = {x[r % x.size()].get(), DType::bf16, {T, d}};
  if (layer.router != RouterKind::none) {
    a.w_router = {wr.get(), DType::bf16, {E, d}};
  } else {
    a.topk_ids = {ids.get(), DType::i32, {T, K}};
    a.topk_weights = {gates.get(), DType::f32, {T, K}};
  }
  a.w1 = {w1.get(), DType::bf16, w1_shape(layer)};
  if (is_gated(layer.activation) && !layer.fused_gate_up()) a.w3 = {w3.get(), DType::bf16, {E, n, d}};
  a.w2 = {w2.get(), DType::bf16, {E, d, n}};
  if (layer.expert_bias) {
    a.bias_up = {bias_up.get(), DType::bf16, {E, int64_t{layer.gate_parts()} * n}};
    a.bias_down = {bias_down.get(), DType::bf16, {E, d}};
  }
  a.y = {y.get(), DType::bf16, {T, d}};
  a.mode = mode;
  a.saved = saved.get();
  a.saved_bytes = saved.size();
  a.scratch = fscratch.get();
  a.scratch_bytes = fscratch.size();
  return a;
}

BackwardArgs TimingWorkspace::backward_args(int r) const {
  const int E = layer.shape.experts, K = layer.shape.topk, d = layer.shape.hidden, n = layer.shape.ffn;
  const int64_t T = tokens;
  const ForwardArgs f = forward_args(r);
  BackwardArgs b;
  b.dy = {dy[r % dy.size()].get(), DType::bf16, {T, d}};
  b.x = f.x;
  b.topk_weights = f.topk_weights;
  b.w_router = f.w_router;
  b.w1 = f.w1;
  b.w3 = f.w3;
  b.w2 = f.w2;
  b.bias_up = f.bias_up;
  b.bias_down = f.bias_down;
  if (layer.expert_bias) {
    b.d_bias_up = {dbias_up.get(), DType::bf16, f.bias_up.shape};
    b.d_bias_down = {dbias_down.get(), DType::bf16, f.bias_down.shape};
  }
  b.dx = {dx.get(), DType::bf16, {T, d}};
  b.dw1 = {dw1.get(), DType::bf16, w1_shape(layer)};
  if (is_gated(layer.activation) && !layer.fused_gate_up()) b.dw3 = {dw3.get(), DType::bf16, {E, n, d}};
  b.dw2 = {dw2.get(), DType::bf16, {E, d, n}};
  b.d_topk_weights = {dgates.get(), DType::f32, {T, K}};
  if (layer.router != RouterKind::none) b.dw_router = {dwr.get(), DType::bf16, {E, d}};
  b.scratch = bscratch.get();
  b.scratch_bytes = bscratch.size();
  return b;
}

}  // namespace moeblaze
