#include "layer_config.hpp"

#include <fmt/format.h>

#include "core/checked.hpp"
#include "core/errors.hpp"

namespace moeblaze {

void LayerConfig::validate() const {
  const MoeShape& s = shape;
  require_in_range(s.experts, 1, kMaxExperts, "experts", "E");
  require_in_range(s.topk, 1, kMaxTopk, "topk", "K");
  if (s.topk > s.experts)
    throw InvalidArgument("topk", fmt::format("K = {} is larger than E = {}", s.topk, s.experts));
  require_in_range(s.hidden, 8, kMaxWidth, "hidden", "d");
  if (s.hidden % 8 != 0)
    throw InvalidArgument("hidden", fmt::format("d = {} must be a positive multiple of 8", s.hidden));
  require_in_range(s.ffn, 8, kMaxWidth, "ffn", "n");
  if (s.ffn % 8 != 0)
    throw InvalidArgument("ffn", fmt::format("n = {} must be a positive multiple of 8", s.ffn));
  require_finite(route_scale, 0, kMaxRouteScale, "route_scale");
  if (!(route_scale > 0.f))
    throw InvalidArgument("route_scale", fmt::format("{} must be positive", route_scale));
  if (weight_layout != WeightLayout::separate && weight_layout != WeightLayout::fused_gate_up)
    throw InvalidArgument("weight_layout", fmt::format("{} is not a WeightLayout", static_cast<int>(weight_layout)));
  if (fused_gate_up() && !is_gated(activation))
    throw InvalidArgument("weight_layout", fmt::format("a fused gate_up needs a gated activation (swiglu, geglu), not {}",
                                                       to_string(activation)));
}

std::string to_string(Activation a) {
  switch (a) {
    case Activation::swiglu: return "swiglu";
    case Activation::geglu: return "geglu";
    case Activation::silu: return "silu";
    case Activation::gelu: return "gelu";
    case Activation::relu: return "relu";
    case Activation::clamped_swiglu: return "clamped_swiglu";
  }
  return "unknown";
}

std::string to_string(RouterKind r) {
  switch (r) {
    case RouterKind::none: return "none";
    case RouterKind::softmax_topk: return "softmax";
    case RouterKind::sigmoid_topk: return "sigmoid";
  }
  return "unknown";
}

std::string to_string(WeightLayout w) { return w == WeightLayout::fused_gate_up ? "fused" : "separate"; }

WeightLayout parse_weight_layout(const std::string& s) {
  if (s == "separate") return WeightLayout::separate;
  if (s == "fused") return WeightLayout::fused_gate_up;
  throw InvalidArgument("weight_layout", fmt::format("'{}' is not one of separate, fused", s));
}

Activation parse_activation(const std::string& s) {
  for (Activation a : {Activation::swiglu, Activation::geglu, Activation::silu, Activation::gelu, Activation::relu,
                       Activation::clamped_swiglu})
    if (to_string(a) == s) return a;
  throw InvalidArgument("activation",
                        fmt::format("'{}' is not one of swiglu, geglu, silu, gelu, relu, clamped_swiglu", s));
}

RouterKind parse_router(const std::string& s) {
  for (RouterKind r : {RouterKind::none, RouterKind::softmax_topk, RouterKind::sigmoid_topk})
    if (to_string(r) == s) return r;
  throw InvalidArgument("router", fmt::format("'{}' is not one of none, softmax, sigmoid", s));
}

std::string LayerConfig::describe() const {
  std::string r = to_string(router);
  if (router != RouterKind::none) {
    if (renormalize) r += ",renorm";
    if (route_scale != 1.f) r += fmt::format(",scale={}", route_scale);
  }
  // The separate layout keeps the description (and so the cache keys) it always had.
  return fmt::format("E={} K={} d={} n={} {} router={}{}{}", shape.experts, shape.topk, shape.hidden, shape.ffn,
                     to_string(activation), r, fused_gate_up() ? " gate_up=fused" : "", expert_bias ? " bias" : "");
}

namespace {
Preset make(const char* name, int E, int K, int d, int n, int64_t T, RouterKind router, bool renorm,
            float scale, bool suite) {
  Preset p;
  p.name = name;
  p.layer.shape = {E, K, d, n};
  p.layer.router = router;
  p.layer.renormalize = renorm;
  p.layer.route_scale = scale;
  p.tokens = T;
  p.in_suite = suite;
  return p;
}
}  // namespace

const std::vector<Preset>& presets() {
  // The first six are the benchmark suite (bench/suite.json; a CPU test checks they
  // agree). Routers follow the public model configurations.
  static const std::vector<Preset> all = {
      make("mixtral-8x7b", 8, 2, 4096, 14336, 16384, RouterKind::softmax_topk, true, 1.f, true),
      make("gpt-oss-20b", 32, 4, 2880, 2880, 16384, RouterKind::softmax_topk, true, 1.f, true),
      make("olmoe-1b-7b", 64, 8, 2048, 1024, 32768, RouterKind::softmax_topk, false, 1.f, true),
      make("qwen3-30b-a3b", 128, 8, 2048, 768, 32768, RouterKind::softmax_topk, true, 1.f, true),
      make("deepseek-v3", 256, 8, 7168, 2048, 16384, RouterKind::sigmoid_topk, true, 2.5f, true),
      make("qwen3-next-80b", 512, 10, 2048, 512, 32768, RouterKind::softmax_topk, true, 1.f, true),
      make("qwen3-235b-a22b", 128, 8, 4096, 1536, 16384, RouterKind::softmax_topk, true, 1.f, false),
      make("deepseek-v2-lite", 64, 6, 2048, 1408, 32768, RouterKind::softmax_topk, false, 1.f, false),
  };
  return all;
}

const Preset& find_preset(const std::string& name) {
  for (const auto& p : presets())
    if (p.name == name) return p;
  std::string names;
  for (const auto& p : presets()) names += (names.empty() ? "" : ", ") + p.name;
  throw InvalidArgument("preset", fmt::format("unknown preset '{}'; known: {}", name, names));
}

}  // namespace moeblaze
