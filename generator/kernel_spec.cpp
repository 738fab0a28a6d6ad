#include "kernel_spec.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <cstring>

#include "core/errors.hpp"
#include "kernel_layer.hpp"

namespace moeblaze {
namespace {

struct FamilyInfo {
  KernelFamily family;
  const char* name;
  const char* header;    // template header the instantiation includes
  const char* function;  // device function template
  const char* args;      // argument struct
  const char* older = nullptr;  // its older name (docs/design.md, "Glossary"), still read
};

const FamilyInfo kFamilies[] = {
    {KernelFamily::router_logits, "router_logits", "moeblaze/router.cuh", "moeblaze::router::logits_gemm", "RouterGemmArgs"},
    {KernelFamily::router_topk, "router_topk", "moeblaze/router.cuh", "moeblaze::router::topk", "RouterTopkArgs"},
    {KernelFamily::index_count, "index_count", "moeblaze/index_build.cuh", "moeblaze::index_build::count", "IndexBuildArgs"},
    {KernelFamily::index_scan, "index_scan", "moeblaze/index_build.cuh", "moeblaze::index_build::scan", "IndexBuildArgs"},
    {KernelFamily::index_scatter, "index_scatter", "moeblaze/index_build.cuh", "moeblaze::index_build::scatter", "IndexBuildArgs"},
    {KernelFamily::gate_up, "gate_up", "moeblaze/expert_gemms.cuh", "moeblaze::gate_up", "GateUpArgs", "up_proj"},
    {KernelFamily::down_proj, "down_proj", "moeblaze/expert_gemms.cuh", "moeblaze::down_proj", "DownProjArgs"},
    {KernelFamily::combine, "combine", "moeblaze/reductions.cuh", "moeblaze::reductions::combine", "CombineArgs"},
    {KernelFamily::down_dgrad, "down_dgrad", "moeblaze/expert_gemms.cuh", "moeblaze::down_dgrad", "DownDgradArgs"},
    {KernelFamily::gate_grad, "gate_grad", "moeblaze/reductions.cuh", "moeblaze::reductions::gate_grad", "GateGradArgs"},
    {KernelFamily::down_wgrad, "down_wgrad", "moeblaze/expert_gemms.cuh", "moeblaze::down_wgrad", "WgradArgs"},
    {KernelFamily::gate_up_wgrad, "gate_up_wgrad", "moeblaze/expert_gemms.cuh", "moeblaze::gate_up_wgrad", "WgradArgs",
     "up_wgrad"},
    {KernelFamily::gate_up_dgrad, "gate_up_dgrad", "moeblaze/expert_gemms.cuh", "moeblaze::gate_up_dgrad",
     "GateUpDgradArgs", "up_dgrad"},
    {KernelFamily::router_backward, "router_backward", "moeblaze/router.cuh", "moeblaze::router::backward", "RouterBackwardArgs"},
    {KernelFamily::router_dgrad, "router_dgrad", "moeblaze/router.cuh", "moeblaze::router::dgrad_gemm", "RouterGemmArgs"},
    {KernelFamily::router_wgrad, "router_wgrad", "moeblaze/router.cuh", "moeblaze::router::wgrad_gemm", "RouterGemmArgs"},
    {KernelFamily::bias_grad, "bias_grad", "moeblaze/bias_grads.cuh", "moeblaze::bias_grad", "BiasGradArgs"},
    {KernelFamily::gate_bias_grad, "gate_bias_grad", "moeblaze/bias_grads.cuh", "moeblaze::gate_bias_grad",
     "GateBiasGradArgs"},
};

const FamilyInfo& info(KernelFamily f) {
  for (const auto& i : kFamilies)
    if (i.family == f) return i;
  throw Error("unknown kernel family");
}

// Each mainloop's tile-name suffix and its older one (docs/design.md, "Glossary"), which
// parse() still reads.
struct MainloopName {
  Mainloop mainloop;
  const char* suffix;
  const char* older;
  const char* literal;  // the enumerator in generated source
};
const MainloopName kMainloopNames[] = {
    {Mainloop::mma_sync, "", "", "moeblaze::Mainloop::mma_sync"},
    {Mainloop::wgmma_multistage, "_wgmma", "_wg", "moeblaze::Mainloop::wgmma_multistage"},
    {Mainloop::warp_specialized, "_ws", "_ws", "moeblaze::Mainloop::warp_specialized"},
    {Mainloop::persistent, "_persist", "_wsp", "moeblaze::Mainloop::persistent"},
    {Mainloop::pingpong, "_pingpong", "_pp", "moeblaze::Mainloop::pingpong"},
};

const char* mainloop_literal(Mainloop m) {
  for (const MainloopName& n : kMainloopNames)
    if (n.mainloop == m) return n.literal;
  throw Error("unknown mainloop");
}

std::string activation_literal(Activation a) { return "moeblaze::Activation::" + to_string(a); }

std::string router_literal(RouterKind r) {
  return r == RouterKind::sigmoid_topk ? "moeblaze::RouterKind::sigmoid_topk" : "moeblaze::RouterKind::softmax_topk";
}

// Template arguments after the tile config (if any), in the order the template takes them.
std::string shape_arguments(const KernelSpec& s) {
  const MoeShape& m = s.layer.shape;
  const int E = m.experts, K = m.topk, D = m.hidden, N = m.ffn;
  const std::string act = activation_literal(s.layer.activation);
  if (s.family == KernelFamily::gate_up)
    return fmt::format("{}, {}, {}, {}, {}, {}", E, D, N, act, s.layer.w1_rows(), s.layer.expert_bias ? "true" : "false");
  switch (s.family) {
    case KernelFamily::router_logits:
    case KernelFamily::router_dgrad:
    case KernelFamily::router_wgrad: return fmt::format("{}, {}", E, D);
    case KernelFamily::router_topk:
    case KernelFamily::router_backward:
      return fmt::format("{}, {}, {}, {}", E, K, router_literal(s.layer.router), s.layer.renormalize ? "true" : "false");
    case KernelFamily::index_count:
    case KernelFamily::index_scan:
    case KernelFamily::index_scatter: return fmt::format("{}, {}", E, K);
    case KernelFamily::gate_up:
    case KernelFamily::gate_up_dgrad:
    case KernelFamily::gate_up_wgrad: return fmt::format("{}, {}, {}, {}, {}", E, D, N, act, s.layer.w1_rows());
    case KernelFamily::down_proj: return fmt::format("{}, {}, {}, {}", E, D, N, s.layer.expert_bias ? "true" : "false");
    case KernelFamily::down_wgrad: return fmt::format("{}, {}, {}", E, D, N);
    case KernelFamily::bias_grad: return fmt::format("{}, {}, {}, {}, {}", E, K, D, N, s.layer.gate_parts());
    case KernelFamily::gate_bias_grad: return fmt::format("{}, {}, {}", E, K, D);
    case KernelFamily::down_dgrad: return fmt::format("{}, {}, {}, {}, {}", E, K, D, N, act);
    case KernelFamily::combine: return fmt::format("{}, {}", D, K);
    case KernelFamily::gate_grad: return fmt::format("{}", (N + s.tile.bn - 1) / s.tile.bn);
  }
  throw Error("unknown kernel family");
}

int untiled_threads(KernelFamily f) {
  switch (f) {
    case KernelFamily::index_scan: return 1024;
    case KernelFamily::combine: return 128;
    default: return 256;
  }
}

}  // namespace

std::string to_string(KernelFamily f) { return info(f).name; }

std::vector<std::string> family_names(KernelFamily f) {
  const FamilyInfo& i = info(f);
  if (i.older) return {i.name, i.older};
  return {i.name};
}

const std::vector<KernelFamily>& all_families() {
  static const std::vector<KernelFamily> all = [] {
    std::vector<KernelFamily> v;
    for (const auto& i : kFamilies) v.push_back(i.family);
    return v;
  }();
  return all;
}

bool family_runs(KernelFamily f, const LayerConfig& layer) {
  switch (f) {
    case KernelFamily::router_logits:
    case KernelFamily::router_topk:
    case KernelFamily::router_backward:
    case KernelFamily::router_dgrad:
    case KernelFamily::router_wgrad: return layer.router != RouterKind::none;
    case KernelFamily::bias_grad:
    case KernelFamily::gate_bias_grad: return layer.expert_bias;
    default: return true;
  }
}

bool is_tiled(KernelFamily f) {
  switch (f) {
    case KernelFamily::router_logits:
    case KernelFamily::gate_up:
    case KernelFamily::down_proj:
    case KernelFamily::down_dgrad:
    case KernelFamily::down_wgrad:
    case KernelFamily::gate_up_wgrad:
    case KernelFamily::gate_up_dgrad:
    case KernelFamily::router_dgrad:
    case KernelFamily::router_wgrad: return true;
    default: return false;
  }
}

std::optional<KernelFamily> tile_follows(KernelFamily f) {
  if (f == KernelFamily::gate_grad) return KernelFamily::down_dgrad;
  return std::nullopt;
}

void tie_following_tiles(std::vector<KernelSpec>& specs) {
  for (KernelSpec& s : specs)
    if (const auto leader = tile_follows(s.family))
      for (const KernelSpec& l : specs)
        if (l.family == *leader) s.tile = l.tile;
}

int stacked_b_tiles(KernelFamily f, Activation act) {
  return f == KernelFamily::gate_up && is_gated(act) ? 2 : 1;
}

std::string TileConfig::to_string() const {
  std::string s = fmt::format("{}x{}x{}_w{}x{}_s{}", bm, bn, bk, warps_m, warps_n, stages);
  for (const MainloopName& m : kMainloopNames)
    if (m.mainloop == mainloop) s += m.suffix;
  if (tma_contiguous) s += "_tmacontig";
  if (tma_store) s += tma_store_blocks ? "_tmastore64" : "_tmastore";
  if (alt_order) s += "_altorder";
  if (direct_arrive) s += "_directarrive";
  if (cluster_m > 1) s += fmt::format("_cluster{}x1", cluster_m);
  if (cute) s += "_cute";
  return s;
}

TileConfig wgmma_tile(int bm, int bn, int stages, Mainloop mainloop) {
  // Warps holding accumulators: ping-pong one warpgroup; cooperative one 16-row slab a warp,
  // except 256-row warp-specialised tiles: two warpgroups of two m64 slabs each.
  const bool two_slabs = bm == 256 && is_warp_specialized(mainloop) && mainloop != Mainloop::pingpong;
  TileConfig t{bm, bn, 64, mainloop == Mainloop::pingpong ? 4 : two_slabs ? 8 : bm / 16, 1, stages};
  t.mainloop = mainloop;
  return t;
}

TileConfig pingpong_tile(int bm, int bn, int stages) { return wgmma_tile(bm, bn, stages, Mainloop::pingpong); }

std::string to_string(Arch a) {
  return a == Arch::sm_90a ? "sm_90a" : fmt::format("sm_{}", static_cast<int>(a));
}

Arch parse_arch(const std::string& s) {
  // A plain target name (it becomes an NVRTC option): sm_ and 2 or 3 digits; the "a" suffix
  // only on sm_90a, the one architecture-specific target the kernels know.
  if (s == "sm_90a") return Arch::sm_90a;
  const std::string digits = s.rfind("sm_", 0) == 0 ? s.substr(3) : "";
  if (digits.size() < 2 || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string::npos ||
      digits[0] == '0')
    throw InvalidArgument("arch", fmt::format("'{}' is not a target like sm_90a", s));
  if (digits == "90")
    throw InvalidArgument("arch", "'sm_90' lacks the wgmma and setmaxnreg instructions the Hopper tiles use: use sm_90a");
  return static_cast<Arch>(std::stoi(digits));
}

bool supports_wgmma(KernelFamily f) { return is_tiled(f); }

bool is_narrow_step_bn(int bn) { return bn == 96 || bn == 160 || bn == 208 || bn == 224; }

bool is_slot_tiled(KernelFamily f) {
  return f == KernelFamily::gate_up || f == KernelFamily::down_proj || f == KernelFamily::down_dgrad ||
         f == KernelFamily::gate_up_dgrad;
}

bool supports_persistent(KernelFamily f) {
  switch (f) {
    case KernelFamily::gate_up:
    case KernelFamily::down_proj:
    case KernelFamily::down_dgrad:
    case KernelFamily::down_wgrad:
    case KernelFamily::gate_up_wgrad:
    case KernelFamily::gate_up_dgrad: return true;
    default: return false;
  }
}

TileConfig TileConfig::parse(const std::string& s) {
  // Read strictly (no sign, no spaces, bounded digits, nothing after the last suffix), and each
  // number within a range whose products (threads, shared memory, registers) fit an int: tiles
  // come from cache files and command lines, not only from to_string().
  auto malformed = [&s] {
    return InvalidArgument(
        "tile", fmt::format("'{}' is not of the form BMxBNxBK_wMxN_sS[_wgmma|_ws|_persist|_pingpong][_tmacontig]"
                            "[_tmastore|_tmastore64][_altorder][_directarrive][_clusterCx1][_cute] (e.g. 128x128x64_w2x4_s4, "
                            "128x256x64_w8x1_s4_persist_tmacontig; docs/design.md, \"Glossary\")",
                            s));
  };
  size_t at = 0;
  auto literal = [&](const char* text) {
    const size_t n = std::strlen(text);
    if (s.compare(at, n, text) != 0) return false;
    at += n;
    return true;
  };
  // A whole suffix: `text` followed by the end or the next "_" (so "_ws" never reads the
  // start of "_wsp", nor "_tma" that of "_tmastore").
  auto suffix = [&](const char* text) {
    const size_t n = std::strlen(text);
    if (s.compare(at, n, text) != 0 || (at + n < s.size() && s[at + n] != '_')) return false;
    at += n;
    return true;
  };
  auto either = [&](const char* name, const char* older) { return suffix(name) || suffix(older); };
  auto number = [&](int lo, int hi, const char* what) {
    int v = 0, digits = 0;
    while (at < s.size() && std::isdigit(static_cast<unsigned char>(s[at])) && digits < 5) v = v * 10 + (s[at++] - '0'), ++digits;
    if (digits == 0 || (at < s.size() && std::isdigit(static_cast<unsigned char>(s[at])))) throw malformed();
    if (v < lo || v > hi)
      throw InvalidArgument("tile", fmt::format("'{}': {} = {} is outside [{}, {}]", s, what, v, lo, hi));
    return v;
  };
  TileConfig t;
  t.bm = number(1, 1024, "bm");
  if (!literal("x")) throw malformed();
  t.bn = number(1, 1024, "bn");
  if (!literal("x")) throw malformed();
  t.bk = number(1, 1024, "bk");
  if (!literal("_w")) throw malformed();
  t.warps_m = number(1, 64, "warps_m");
  if (!literal("x")) throw malformed();
  t.warps_n = number(1, 64, "warps_n");
  if (!literal("_s")) throw malformed();
  t.stages = number(1, 64, "stages");
  for (const MainloopName& m : kMainloopNames)
    if (*m.suffix && either(m.suffix, m.older)) {
      t.mainloop = m.mainloop;
      break;
    }
  if (t.wgmma()) {
    t.tma_contiguous = either("_tmacontig", "_tma");
    if (suffix("_tmastore64")) t.tma_store = t.tma_store_blocks = true;
    else t.tma_store = either("_tmastore", "_tstore");
    t.alt_order = either("_altorder", "_swap");
    t.direct_arrive = suffix("_directarrive");
    if (literal("_cluster")) {
      t.cluster_m = number(2, 16, "cluster_m");
      if (!suffix("x1")) throw malformed();
    } else if (suffix("_c2")) {
      t.cluster_m = 2;
    }
    t.cute = suffix("_cute");
  }
  if (at != s.size()) throw malformed();
  return t;
}

KernelFamily parse_family(const std::string& s) {
  std::string names;
  for (const auto& i : kFamilies) {
    if (s == i.name || (i.older && s == i.older)) return i.family;
    names += std::string(names.empty() ? "" : ", ") + i.name;
  }
  throw InvalidArgument("family", fmt::format("'{}' is not a kernel family ({})", s, names));
}

std::string KernelSpec::name() const {
  const MoeShape& m = layer.shape;
  std::string n = fmt::format("mb_{}_E{}_K{}_d{}_n{}", to_string(family), m.experts, m.topk, m.hidden, m.ffn);
  switch (family) {
    case KernelFamily::gate_up:
    case KernelFamily::down_dgrad:
    case KernelFamily::gate_up_wgrad:
    case KernelFamily::gate_up_dgrad:
      n += "_" + moeblaze::to_string(layer.activation);
      // The up-side kernels read (and write) W1/W3 in the layer's layout.
      if (layer.fused_gate_up() && family != KernelFamily::down_dgrad) n += "_fused";
      if (layer.expert_bias && family == KernelFamily::gate_up) n += "_bias";
      break;
    case KernelFamily::down_proj:
      if (layer.expert_bias) n += "_bias";
      break;
    case KernelFamily::bias_grad: n += "_" + moeblaze::to_string(layer.activation); break;
    case KernelFamily::router_topk:
    case KernelFamily::router_backward:
      n += "_" + moeblaze::to_string(layer.router) + (layer.renormalize ? "_renorm" : ""); break;
    default: break;
  }
  if (is_tiled(family) || tile_follows(family)) n += "_" + tile.to_string();
  return n;
}

int KernelSpec::cluster_size() const { return is_tiled(family) ? tile.cluster_m : 1; }

bool header_needs_cutlass(const std::string& header) { return header.rfind("moeblaze/sm90/", 0) == 0; }


std::string legality_problem(const KernelSpec& spec, int max_smem_bytes) {
  if (!is_tiled(spec.family)) return {};
  const TileConfig& t = spec.tile;
  if (t.cute) return kernel_layer_problem(spec, max_smem_bytes);
  if (t.bk != 64) return "bk must be 64 (one 128-byte swizzle group per row)";
  if (t.wgmma()) {
    if (!supports_wgmma(spec.family)) return "wgmma tiles are for GEMM families";
    if (t.pingpong()) {
      if (t.warps_m != 4 || t.warps_n != 1) return "ping-pong tiles have 4 x 1 warps (one warpgroup per tile)";
      if (t.bm != 64 && t.bm != 128) return "ping-pong tiles have bm 64 or 128 (one warpgroup's m64 slabs)";
      if (!supports_persistent(spec.family)) return "ping-pong tiles are for the expert GEMMs";
    } else if (t.warps_n != 1 || (t.warps_m != t.bm / 16 && !(t.warp_specialized() && t.bm == 256 && t.warps_m == 8))) {
      // 256-row warp-specialised tiles: two consumer warpgroups of 128 rows (two m64 slabs) each
      return "wgmma tiles have bm/16 x 1 warps (256-row warp-specialised tiles: 8 x 1, two slabs a warpgroup)";
    }
    if (t.bm % 64) return "wgmma tiles cover whole warpgroups (bm a multiple of 64)";
    if (is_narrow_step_bn(t.bn)) {
      // bn % 64 != 0: the weight boxes of gate_up and down_proj are K-major TMA boxes of bn rows
      // (any row count; a cluster pair's half boxes of bn / 2 rows, a multiple of 8), and their
      // epilogues store from registers. MN-major weight stages, the cp.async weight loader's
      // column split and the 64-column output staging need bn % 64 == 0.
      if (spec.family != KernelFamily::gate_up && spec.family != KernelFamily::down_proj)
        return fmt::format("wgmma bn {} is for gate_up and down_proj (K-major weight tiles); other families take 64, 128, 192 or 256", t.bn);
      if (!t.tma_contiguous || t.tma_store)
        return fmt::format("wgmma bn {} needs TMA weight loads (_tmacontig) and register stores (no _tmastore)", t.bn);
    } else if (t.bn != 64 && t.bn != 128 && t.bn != 192 && t.bn != 256) {
      return "wgmma bn must be 64, 128, 192 or 256 (96, 160, 208 or 224 for gate_up and down_proj TMA tiles)";
    }
    // Wide-h layers run down dgrad + down wgrad in hg column chunks of a multiple of 256
    // (runtime/memory_plan.cpp backward_chunk_cols), which a 192-wide tile does not divide.
    if (t.bn == 192 && (spec.family == KernelFamily::down_dgrad || spec.family == KernelFamily::down_wgrad))
      return "192-wide tiles are not for down_dgrad / down_wgrad (their column chunks are multiples of 256)";
    // The cp.async tile loader gives each of 128 producer threads one 16-byte column of the
    // tile (gemm/loaders.cuh TileLoader): 24 chunks per 192-wide row do not divide 128.
    if (t.bn == 192 && spec.family != KernelFamily::gate_up_wgrad && !t.tma_contiguous)
      return "192-wide tiles need TMA loads (the cp.async loader cannot split a 192-wide row among 128 threads)";
    if (t.warp_specialized() && t.compute_threads() > 256)
      return "warp-specialised tiles have one or two consumer warpgroups";
    if (t.persistent() && !supports_persistent(spec.family)) return "persistent tiles are for the expert GEMMs";
  }
  if (t.alt_order && (!t.wgmma() || !supports_persistent(spec.family)))
    return "the other tile order (_altorder) is for wgmma tiles of the expert GEMMs";
  if (t.tma_contiguous) {
    if (!t.warp_specialized())
      return "TMA loads (_tmacontig) are for warp-specialised tiles (_ws, _persist, _pingpong): the producer issues the copies";
    if (!is_tiled(spec.family) || !supports_persistent(spec.family))
      return "TMA loads are for the expert GEMMs";
    // MN-major weight stages (64 k rows) must not straddle an expert's rows or W1|W3.
    if (spec.family == KernelFamily::down_dgrad && spec.layer.shape.hidden % 64)
      return "TMA down_dgrad tiles need d % 64 == 0 (W2 k stages inside one expert)";
    if (spec.family == KernelFamily::gate_up_dgrad && spec.layer.shape.ffn % 64)
      return "TMA gate_up_dgrad tiles need n % 64 == 0 (W1/W3 k stages inside one matrix)";
  }
  if (t.direct_arrive && (!t.warp_specialized() || t.cluster_m != 1))
    return "_directarrive is a pipeline of warp-specialised tiles without clusters";
  if (t.cluster_m != 1) {
    if (t.cluster_m != 2) return "clusters are of 1 or 2 blocks";
    if (!t.persistent() || !t.tma_contiguous)
      return "cluster pairs are persistent TMA tiles (_persist or _pingpong with _tmacontig)";
    if (!is_slot_tiled(spec.family)) return "cluster pairs share the weight operand of the slot-tiled expert GEMMs (not the weight gradients)";
    if (t.bm * 2 != 128 && t.bm * 2 != 256) return "a cluster pair's tile (2 bm rows) must be 128 or 256 rows";
    if ((spec.family == KernelFamily::down_dgrad || spec.family == KernelFamily::gate_up_dgrad) && t.bn % 128)
      return "cluster pairs split MN-major weight stages by 64-column boxes: bn a multiple of 128";
  }
  if (t.tma_store) {
    const bool wgrad = spec.family == KernelFamily::gate_up_wgrad || spec.family == KernelFamily::down_wgrad;
    const bool slot_rows = spec.family == KernelFamily::down_proj || spec.family == KernelFamily::gate_up_dgrad;
    if (!wgrad && !slot_rows)
      return "TMA-store epilogues (_tmastore) are for the weight gradients, down_proj and gate_up_dgrad";
    if (!t.warp_specialized()) return "TMA-store epilogues are for warp-specialised tiles (_ws, _persist, _pingpong)";
    if (slot_rows && (t.cluster_m != 1 || !t.tma_contiguous))
      return "TMA-store epilogues of per-slot outputs are for TMA tiles (_tmacontig) without clusters";
    if (spec.family == KernelFamily::down_proj && spec.layer.expert_bias)
      return "down_proj's TMA-store epilogue does not add expert biases";
    // Output rows 16-byte aligned for the [E][rows][cols] maps: dW2 rows are n wide, dW1/dW3 d.
    const int cols = spec.family == KernelFamily::down_wgrad ? spec.layer.shape.ffn : spec.layer.shape.hidden;
    if (cols % 8) return "TMA-store epilogues need output rows of a multiple of 8 elements (16 bytes)";
  }
  if (t.bm % 64 || t.bm > 256 || t.bn > 256 || (t.bn % 64 && !(t.wgmma() && is_narrow_step_bn(t.bn))))
    return "bm and bn must be 64, 128, 192 or 256 (wgmma bn also 96, 160, 208 or 224)";
  if (t.bm % (16 * t.warps_m) || t.bn % (8 * t.warps_n)) return "warp tiles must be multiples of 16x8";
  if (!t.wgmma() && (t.bn / t.warps_n / 8) % 2) return "each warp needs an even number of n8 tiles";
  if (t.threads() > 512) return "at most 16 warps";
  if (t.stages < 2 || t.stages > 8) return "stages must be in [2, 8]";
  if (is_slot_tiled(spec.family) && t.bm != 64 && t.bm != 128 && t.bm != 256) return "slot-tiled GEMMs need bm in {64,128,256}";
  const int nb = stacked_b_tiles(spec.family, spec.layer.activation);
  const int acc_regs = (t.bm / t.warps_m) * (t.bn / t.warps_n) * nb / 32;
  // A ping-pong warpgroup may hold a whole 128 x 192 tile (consumers 224 registers, the producer
  // 56: gemm/scheduler/tile_walk.cuh RegisterSplit); other tiles keep the consumers' 200.
  const int max_acc = t.pingpong() ? 192 : 160;
  if (acc_regs > max_acc) return fmt::format("{} accumulator registers per thread is too many (at most {})", acc_regs, max_acc);
  const int chunks_a = t.bm * t.bk / 8, chunks_b = nb * t.bn * t.bk / 8;
  if (chunks_a % t.loader_threads() || chunks_b % t.loader_threads())
    return "tile loads must divide evenly among threads";
  if (t.smem_bytes(nb) > max_smem_bytes)
    return fmt::format("{} bytes of shared memory exceeds {}", t.smem_bytes(nb), max_smem_bytes);
  return {};
}

GeneratedKernel generate(const KernelSpec& spec) {
  spec.layer.validate();
  if (const std::string why = legality_problem(spec); !why.empty())
    throw InvalidArgument("tile", fmt::format("{} for {}: {}", spec.tile.to_string(), to_string(spec.family), why));
  const FamilyInfo& fi = info(spec.family);
  GeneratedKernel g;
  g.spec = spec;
  g.source.kernel_name = spec.name();
  g.source.file_name = spec.name() + ".cu";
  std::string targs = shape_arguments(spec);
  const char* header = fi.header;
  const char* function = fi.function;
  if (is_tiled(spec.family) && spec.tile.cute) {
    const KernelLayerDef& k = *kernel_layer_family(spec.family);
    header = k.header;
    function = k.function;
    targs = kernel_layer_template_arguments(spec);
    g.source.needs_cutlass = header_needs_cutlass(header);
    g.threads = spec.tile.threads();
    g.dynamic_smem = kernel_layer_smem_bytes(spec);
  } else if (is_tiled(spec.family)) {
    const TileConfig& t = spec.tile;
    const int nb = stacked_b_tiles(spec.family, spec.layer.activation);
    // The int(...) keeps gemm::Tile's parameters ints (gemm/tile.cuh); trailing parameters at
    // their defaults are left out, so a kernel's source names only what its tile sets.
    targs = fmt::format("moeblaze::gemm::Tile<{}, {}, {}, {}, {}, {}, {}, int({}), {}, {}, {}{}{}>, {}", t.bm, t.bn, t.bk,
                        t.warps_m, t.warps_n, t.stages, nb, mainloop_literal(t.mainloop), t.tma_contiguous ? 1 : 0,
                        t.alt_order ? 1 : 0, t.tma_store ? (t.tma_store_blocks ? 2 : 1) : 0,
                        t.cluster_m == 1 && !t.direct_arrive ? "" : fmt::format(", {}", t.cluster_m),
                        t.direct_arrive ? ", 1" : "", targs);
    g.threads = t.threads();
    g.dynamic_smem = t.smem_bytes(nb);
  } else {
    g.threads = untiled_threads(spec.family);
    g.dynamic_smem = 0;
  }
  // One block per SM is the design point of the GEMM tiles; small kernels keep the default.
  const std::string bounds = is_tiled(spec.family) ? fmt::format("__launch_bounds__({}, 1)", g.threads)
                                                   : fmt::format("__launch_bounds__({})", g.threads);
  g.source.text = fmt::format(
      "// Generated by moeblaze (generator v{}): {} for {}\n"
      "#include \"{}\"\n"
      "extern \"C\" __global__ void {} {}(const {}moeblaze::{} args) {{\n"
      "  {}<{}>(args);\n"
      "}}\n",
      kGeneratorVersion, to_string(spec.family), spec.layer.describe(), header, bounds, g.source.kernel_name,
      // TMA reads its tensor maps from the parameter itself: no local copy of the struct.
      is_tiled(spec.family) && (spec.tile.tma_contiguous || spec.tile.tma_store) ? "__grid_constant__ " : "", fi.args,
      function, targs);
  return g;
}

}  // namespace moeblaze
