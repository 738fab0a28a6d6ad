// Argument checks of forward/backward (moe_layer.hpp): every tensor's dtype, shape and
// alignment and every buffer's size, before any launch; a bad one throws InvalidArgument naming
// the argument. They read no device memory, so they run (and are tested) without a GPU.
#include <fmt/format.h>

#include "core/checked.hpp"
#include "layer_buffers.hpp"
#include "moe_layer.hpp"

namespace moeblaze {
using namespace detail;
namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

void expect_tensor(const TensorRef& t, const char* name, DType dtype, std::vector<int64_t> shape,
                   bool allow_f32 = false) {
  if (!t.ptr) throw InvalidArgument(name, "is missing (null pointer)");
  const bool dtype_ok = t.dtype == dtype || (allow_f32 && t.dtype == DType::f32);
  if (!dtype_ok)
    throw InvalidArgument(name, fmt::format("has dtype {}, expected {}{}", to_string(t.dtype), to_string(dtype),
                                            allow_f32 ? " or f32" : ""));
  if (t.shape != shape)
    throw InvalidArgument(name, fmt::format("has shape {}, expected {}", shape_string(t.shape), shape_string(shape)));
  // Rows are read 16 bytes at a time.
  if (t.ptr % 16 != 0) throw InvalidArgument(name, fmt::format("pointer {:#x} is not 16-byte aligned", t.ptr));
}

void expect_absent(const TensorRef& t, const char* name, const char* why) {
  if (t.ptr) throw InvalidArgument(name, why);
}

void expect_buffer(CUdeviceptr p, size_t have, size_t need, const char* name) {
  if (need == 0) return;
  if (!p) throw InvalidArgument(name, fmt::format("is missing; {} bytes are needed (see memory_plan)", need));
  if (p % kAlign != 0) throw InvalidArgument(name, fmt::format("pointer {:#x} is not {}-byte aligned", p, kAlign));
  if (have < need) throw InvalidArgument(name, fmt::format("has {} bytes, {} are needed (see memory_plan)", have, need));
}

// Per-expert biases: both present (bf16 [E, G*n] and [E, d]) on a layer with expert biases, else absent.
void expect_biases(const LayerConfig& l, const TensorRef& up, const TensorRef& down) {
  const int64_t E = l.shape.experts;
  if (l.expert_bias) {
    expect_tensor(up, "bias_up", DType::bf16, {E, int64_t{l.gate_parts()} * l.shape.ffn});
    expect_tensor(down, "bias_down", DType::bf16, {E, l.shape.hidden});
  } else {
    expect_absent(up, "bias_up", "given, but this layer has no expert biases");
    expect_absent(down, "bias_down", "given, but this layer has no expert biases");
  }
}

int64_t tokens_of(const TensorRef& x, const char* name) {
  if (x.shape.size() != 2) throw InvalidArgument(name, fmt::format("must be 2-D [T,d], got {}", shape_string(x.shape)));
  if (x.shape[0] <= 0) throw InvalidArgument(name, fmt::format("has T = {} tokens; T must be at least 1", x.shape[0]));
  return x.shape[0];
}

}  // namespace

std::vector<int64_t> w1_shape(const LayerConfig& l) { return {l.shape.experts, l.w1_rows(), l.shape.hidden}; }

void validate_forward_args(const LayerConfig& l, int dgrad_bn, const ForwardArgs& a) {
  l.validate();
  const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn;
  const int64_t T = tokens_of(a.x, "x");
  checked_token_slots(T, K, "x");  // before any size is computed from T
  expect_tensor(a.x, "x", DType::bf16, {T, d});
  if (l.router == RouterKind::none) {
    expect_tensor(a.topk_ids, "topk_ids", DType::i32, {T, K});
    expect_tensor(a.topk_weights, "topk_weights", DType::f32, {T, K});
    expect_absent(a.w_router, "w_router", "given, but this layer has no built-in router (router=none)");
  } else {
    expect_tensor(a.w_router, "w_router", DType::bf16, {E, d});
    expect_absent(a.topk_ids, "topk_ids", "given, but the built-in router computes the picks");
    expect_absent(a.topk_weights, "topk_weights", "given, but the built-in router computes the gates");
    if (a.gates_out.present()) expect_tensor(a.gates_out, "gates_out", DType::f32, {T, K});
    if (a.router_bias.present()) {
      if (l.router != RouterKind::sigmoid_topk)
        throw InvalidArgument("router_bias", "only the sigmoid router takes a bias");
      expect_tensor(a.router_bias, "router_bias", DType::f32, {E});
    }
  }
  expect_tensor(a.w1, "w1", DType::bf16, w1_shape(l));
  if (l.fused_gate_up()) expect_absent(a.w3, "w3", "given, but with a fused gate_up W3 is the second half of w1's rows");
  else if (is_gated(l.activation)) expect_tensor(a.w3, "w3", DType::bf16, {E, n, d});
  else expect_absent(a.w3, "w3", "given, but a plain activation uses W1 alone");
  expect_tensor(a.w2, "w2", DType::bf16, {E, d, n});
  expect_biases(l, a.bias_up, a.bias_down);
  expect_tensor(a.y, "y", DType::bf16, {T, d});
  const MemoryPlan p = plan_memory(l, T, a.mode, dgrad_bn);
  expect_buffer(a.saved, a.saved_bytes, p.saved_bytes, "saved");
  expect_buffer(a.scratch, a.scratch_bytes, p.forward_scratch_bytes, "scratch");
}

void validate_backward_args(const LayerConfig& l, int dgrad_bn, const ForwardState& s, const BackwardArgs& a) {
  l.validate();
  if (!s.complete || !s.saved) throw InvalidArgument("state", "no forward has filled this state");
  {
    const auto& o = s.layer.shape;
    const auto& m = l.shape;
    if (o.experts != m.experts || o.topk != m.topk || o.hidden != m.hidden || o.ffn != m.ffn ||
        s.layer.activation != l.activation || s.layer.router != l.router || s.layer.weight_layout != l.weight_layout ||
        s.layer.expert_bias != l.expert_bias)
      throw InvalidArgument("state", fmt::format("comes from a layer of another shape ({}), this layer is {}",
                                                 s.layer.describe(), l.describe()));
  }
  const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn;
  const int64_t T = s.tokens;
  checked_token_slots(T, K, "state");  // a state is a plain value a caller could have filled in
  expect_tensor(a.dy, "dy", DType::bf16, {T, d});
  expect_tensor(a.x, "x", DType::bf16, {T, d});
  expect_tensor(a.w1, "w1", DType::bf16, w1_shape(l));
  if (l.fused_gate_up()) expect_absent(a.w3, "w3", "given, but with a fused gate_up W3 is the second half of w1's rows");
  else if (is_gated(l.activation)) expect_tensor(a.w3, "w3", DType::bf16, {E, n, d});
  expect_tensor(a.w2, "w2", DType::bf16, {E, d, n});
  expect_biases(l, a.bias_up, a.bias_down);
  if (l.expert_bias) {
    expect_tensor(a.d_bias_up, "d_bias_up", DType::bf16, {E, int64_t{l.gate_parts()} * n}, true);
    expect_tensor(a.d_bias_down, "d_bias_down", DType::bf16, {E, d}, true);
    if (a.d_bias_up.dtype != a.dw1.dtype || a.d_bias_down.dtype != a.dw1.dtype)
      throw InvalidArgument(a.d_bias_up.dtype != a.dw1.dtype ? "d_bias_up" : "d_bias_down",
                            "must have the dtype of dw1 (bias gradients are stored or added as the weights')");
  } else {
    expect_absent(a.d_bias_up, "d_bias_up", "given, but this layer has no expert biases");
    expect_absent(a.d_bias_down, "d_bias_down", "given, but this layer has no expert biases");
  }
  expect_tensor(a.dx, "dx", DType::bf16, {T, d});
  expect_tensor(a.dw1, "dw1", DType::bf16, w1_shape(l), true);
  if (l.fused_gate_up()) {
    expect_absent(a.dw3, "dw3", "given, but with a fused gate_up dW3 is the second half of dw1's rows");
  } else if (is_gated(l.activation)) {
    expect_tensor(a.dw3, "dw3", DType::bf16, {E, n, d}, true);
    if (a.dw3.dtype != a.dw1.dtype) throw InvalidArgument("dw3", "must have the same dtype as dw1");
  }
  expect_tensor(a.dw2, "dw2", DType::bf16, {E, d, n}, true);
  if (a.dw2.dtype != a.dw1.dtype) throw InvalidArgument("dw2", "must have the same dtype as dw1");
  if (l.router == RouterKind::none) {
    expect_tensor(a.topk_weights, "topk_weights", DType::f32, {T, K});
    expect_tensor(a.d_topk_weights, "d_topk_weights", DType::f32, {T, K});
  } else {
    expect_tensor(a.w_router, "w_router", DType::bf16, {E, d});
    expect_tensor(a.dw_router, "dw_router", DType::bf16, {E, d}, true);
    if (a.d_topk_weights.present()) expect_tensor(a.d_topk_weights, "d_topk_weights", DType::f32, {T, K});
    if (a.router_bias.present()) expect_tensor(a.router_bias, "router_bias", DType::f32, {E});
  }
  const MemoryPlan p = plan_memory(l, T, s.mode, dgrad_bn);
  if (s.saved_bytes < p.saved_bytes) throw InvalidArgument("state", "saved buffer is smaller than this shape needs");
  expect_buffer(a.scratch, a.scratch_bytes, p.backward_scratch_bytes, "scratch");
}

}  // namespace moeblaze
