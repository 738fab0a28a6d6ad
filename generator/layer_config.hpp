// What a MoE layer is: its shape (compiled into every kernel), activation and router.
// Dimension policy: E, K, d, n, activation and router are compiled in; the token count
// T is a run-time argument (bucketed by the tuner); per-expert counts live on the device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moeblaze/common.cuh"

namespace moeblaze {

struct MoeShape {
  int experts = 0;  // E
  int topk = 0;     // K
  int hidden = 0;   // d, model width
  int ffn = 0;      // n, expert FFN width
};

struct LayerConfig {
  MoeShape shape;
  Activation activation = Activation::swiglu;
  RouterKind router = RouterKind::none;
  bool renormalize = false;  // gates renormalised over the K picks
  float route_scale = 1.f;   // gates multiplied by this (DeepSeek-V3: 2.5)
  // W1/W3 as two [E,n,d] tensors or one fused gate_up [E,2n,d] (compiled into the up-side
  // kernels: their expert stride).
  WeightLayout weight_layout = WeightLayout::separate;
  // Per-expert biases on the up-projection ([E, G*n], added to A and B) and the
  // down-projection ([E, d], added to o), as GPT-OSS has them (compiled in).
  bool expert_bias = false;

  // Throws InvalidArgument naming the field: E in [1,512], K in [1, min(E,16)], d and n
  // multiples of 8 in [8, kMaxWidth], route_scale finite and positive (core/checked.hpp), a
  // fused gate_up only with a gated activation.
  void validate() const;
  std::string describe() const;  // "E=128 K=8 d=2048 n=768 swiglu router=softmax_topk(renorm)"
  int gate_parts() const { return is_gated(activation) ? 2 : 1; }
  bool fused_gate_up() const { return weight_layout == WeightLayout::fused_gate_up; }
  // Rows of one expert in the W1 tensor (and dW1): n, or 2n for a fused gate_up.
  int w1_rows() const { return fused_gate_up() ? 2 * shape.ffn : shape.ffn; }
};

constexpr int kMaxExperts = 512;
constexpr int kMaxTopk = 16;

std::string to_string(Activation a);
std::string to_string(RouterKind r);
Activation parse_activation(const std::string& s);  // throws InvalidArgument("activation", ...)
RouterKind parse_router(const std::string& s);      // "none", "softmax", "sigmoid"
std::string to_string(WeightLayout w);
WeightLayout parse_weight_layout(const std::string& s);  // "separate", "fused"

// Model shapes known by name: the benchmark suite (bench/suite.json) and a few more.
struct Preset {
  std::string name;
  LayerConfig layer;
  int64_t tokens = 0;  // the suite's token count for this shape
  bool in_suite = false;
};
const std::vector<Preset>& presets();
// Throws InvalidArgument("preset", ...) listing the known names.
const Preset& find_preset(const std::string& name);

}  // namespace moeblaze
