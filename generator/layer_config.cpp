#include "layer_config.hpp"

#include <fmt/format.h>

#include "checked.hpp"
#include "errors.hpp"

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
}

std::string to_string(Activation a) {
  switch (a) {
    case Activation::swiglu: return "swiglu";
    case Activation::geglu: return "geglu";
    case Activation::silu: return "silu";
    case Activation::gelu: return "gelu";
    case Activation::relu: return "relu";
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

Activation parse_activation(const std::string& s) {
  for (Activation a : {Activation::swiglu, Activation::geglu, Activation::silu, Activation::gelu, Activation::relu})
    if (to_string(a) == s) return a;
  throw InvalidArgument("activation", fmt::format("'{}' is not one of swiglu, geglu, silu, gelu, relu", s));
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
  return fmt::format("E={} K={} d={} n={} {} router={}", shape.experts, shape.topk, shape.hidden, shape.ffn,
                     to_string(activation), r);
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
