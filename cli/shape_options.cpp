#include <fmt/format.h>

#include "cli/commands.hpp"
#include "core/checked.hpp"
#include "core/errors.hpp"

namespace moeblaze::cli {

void ShapeOptions::add(CLI::App* cmd, bool with_tokens) {
  cmd->add_option("--preset", preset, "model preset (see `moeblaze presets`)");
  // A preset named without --preset (`moeblaze plan qwen3-30b-a3b`), as users type it.
  cmd->add_option("preset", preset_positional, "model preset, the same as --preset NAME");
  cmd->add_option("--experts,-E", experts, "number of experts E (1..512)");
  cmd->add_option("--topk,-K", topk, "experts per token K (1..16, <= E)");
  cmd->add_option("--hidden,-d", hidden, "model width d (multiple of 8, 8..65536)");
  cmd->add_option("--ffn,-n", ffn, "expert FFN width n (multiple of 8, 8..65536)");
  cmd->add_option("--activation", activation, "swiglu | geglu | silu | gelu | relu | clamped_swiglu (GPT-OSS)")
      ->capture_default_str();
  cmd->add_option("--router", router, "none | softmax | sigmoid (default: the preset's, else none)");
  cmd->add_flag("--renormalize", renormalize, "renormalise gates over the K picks (explicit shapes)");
  cmd->add_option("--route-scale", route_scale, "gate scale factor (explicit shapes; finite, > 0)");
  cmd->add_option("--weight-layout", weight_layout,
                  "separate (W1, W3 [E,n,d]) | fused (one gate_up [E,2n,d], the Hugging Face layout)")
      ->capture_default_str();
  cmd->add_flag("--expert-bias", expert_bias, "per-expert biases on both projections (GPT-OSS)");
  if (with_tokens)
    tokens_option = cmd->add_option("--tokens,-T", tokens, "tokens per step T (default: the preset's; T*K < 2^31)");
}

LayerConfig ShapeOptions::layer() const {
  LayerConfig l;
  const bool explicit_shape = experts || topk || hidden || ffn;
  if (!preset_positional.empty() && !preset.empty())
    throw InvalidArgument("--preset", fmt::format("give the preset once: '{}' and --preset {}", preset_positional, preset));
  const std::string& name = preset_positional.empty() ? preset : preset_positional;
  if (!name.empty()) {
    if (explicit_shape)
      throw InvalidArgument("--preset", "give either --preset or --experts/--topk/--hidden/--ffn, not both");
    l = find_preset(name).layer;
  } else {
    if (!explicit_shape) throw InvalidArgument("--preset", "name a preset or give --experts/--topk/--hidden/--ffn");
    if (!experts) throw InvalidArgument("--experts", "missing (needed with an explicit shape)");
    if (!topk) throw InvalidArgument("--topk", "missing (needed with an explicit shape)");
    if (!hidden) throw InvalidArgument("--hidden", "missing (needed with an explicit shape)");
    if (!ffn) throw InvalidArgument("--ffn", "missing (needed with an explicit shape)");
    l.shape = {experts, topk, hidden, ffn};
    l.renormalize = renormalize;
    l.route_scale = route_scale;
  }
  l.activation = parse_activation(activation);
  if (!router.empty()) l.router = parse_router(router);
  try {
    l.weight_layout = parse_weight_layout(weight_layout);
    l.expert_bias = expert_bias;
    l.validate();
  } catch (const InvalidArgument& e) {  // named as the user wrote it
    static const std::map<std::string, std::string> option = {{"experts", "--experts"}, {"topk", "--topk"},
                                                              {"hidden", "--hidden"}, {"ffn", "--ffn"},
                                                              {"route_scale", "--route-scale"},
                                                              {"weight_layout", "--weight-layout"}};
    const auto o = option.find(e.argument);
    if (o == option.end() || (!name.empty() && e.argument != "weight_layout")) throw;
    throw InvalidArgument(o->second, e.reason);
  }
  return l;
}

long long ShapeOptions::token_count(long long fallback) const {
  // An explicit -T is taken as given: -T 0 is refused below, not replaced by the preset's T.
  long long t = tokens;
  const std::string& name = preset_positional.empty() ? preset : preset_positional;
  if (!tokens_given()) {
    if (!name.empty()) t = find_preset(name).tokens;
    if (t == 0) t = fallback;
  }
  if (t <= 0) throw InvalidArgument("--tokens", fmt::format("T = {} must be positive", t));
  checked_token_slots(t, layer().shape.topk, "--tokens");
  return t;
}

void require_timing_routing(const std::string& routing, const char* option) {
  for (const char* r : {"router", "random", "balanced", "skewed"})
    if (routing == r) return;
  throw InvalidArgument(option, fmt::format("'{}' is not one of router, random, balanced, skewed", routing));
}

std::map<KernelFamily, TileConfig> parse_tiles(const std::vector<std::string>& pairs, const char* option) {
  std::map<KernelFamily, TileConfig> out;
  for (const auto& f : pairs) {
    const auto eq = f.find('=');
    if (eq == std::string::npos) throw InvalidArgument(option, fmt::format("'{}' is not FAMILY=TILE", f));
    try {
      out[parse_family(f.substr(0, eq))] = TileConfig::parse(f.substr(eq + 1));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(option, e.what());
    }
  }
  return out;
}

}  // namespace moeblaze::cli
