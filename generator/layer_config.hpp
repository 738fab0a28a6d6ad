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

  // Throws InvalidArgument naming the field: E in [1,512], K in [1, min(E,16)], d and n
  // multiples of 8 in [8, kMaxWidth], route_scale finite and positive (runtime/checked.hpp).
  void validate() const;
  std::string describe() const;  // "E=128 K=8 d=2048 n=768 swiglu router=softmax_topk(renorm)"
  int gate_parts() const { return is_gated(activation) ? 2 : 1; }
};

constexpr int kMaxExperts = 512;
constexpr int kMaxTopk = 16;

std::string to_string(Activation a);
std::string to_string(RouterKind r);
Activation parse_activation(const std::string& s);  // throws InvalidArgument("activation", ...)
RouterKind parse_router(const std::string& s);      // "none", "softmax", "sigmoid"

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
