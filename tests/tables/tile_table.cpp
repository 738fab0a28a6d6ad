#include "tile_table.hpp"

#include <fmt/format.h>

#include "core/errors.hpp"
#include "generator/heuristics.hpp"

namespace moeblaze::tables {
namespace {

// ---- shapes ---------------------------------------------------------------------------

TableShape small(MoeShape s, int64_t T, Activation act = Activation::swiglu,
                 RoutingDistribution routing = RoutingDistribution::random, bool accumulate = false) {
  TableShape t;
  t.layer.shape = s;
  t.layer.activation = act;
  t.tokens = T;
  t.routing = routing;
  t.accumulate_fp32 = accumulate;
  t.name = fmt::format("E{} K{} d{} n{} T{}", s.experts, s.topk, s.hidden, s.ffn, T);
  if (act != Activation::swiglu) t.name += " " + to_string(act);
  if (routing != RoutingDistribution::random) t.name += " " + to_string(routing);
  if (accumulate) t.name += " fp32-accumulate";
  return t;
}

TableShape preset(const std::string& name) {
  const Preset& p = find_preset(name);
  TableShape t;
  t.name = name;
  t.layer = p.layer;
  t.tokens = p.tokens;
  return t;
}

// The small shapes of the device checks, each chosen for what it stresses.
const TableShape kSmall = small({8, 2, 256, 128}, 300);
const TableShape kSkewed = small({64, 8, 256, 192}, 1000, Activation::swiglu, RoutingDistribution::skewed);
const TableShape kSkewedSilu = small({64, 8, 256, 192}, 1000, Activation::silu, RoutingDistribution::skewed);
const TableShape kSkewedGelu = small({64, 8, 256, 192}, 1000, Activation::gelu, RoutingDistribution::skewed);
// d and n not multiples of 64, E not of 8: partial tiles everywhere.
const TableShape kRagged = small({60, 4, 136, 200}, 777, Activation::geglu);
const TableShape kRagged192 = small({60, 4, 192, 200}, 777, Activation::geglu);
const TableShape kRaggedTma = small({60, 4, 192, 256}, 777, Activation::geglu);
// n > d: the forward's slot chunks and the backward's hg column chunks.
const TableShape kChunked = small({8, 2, 128, 1000}, 1000);
const TableShape kChunkedSkewed = small({8, 2, 128, 1000}, 1000, Activation::swiglu, RoutingDistribution::skewed);
const TableShape kChunkedGelu = small({6, 2, 192, 520}, 777, Activation::gelu);
// TMA-store boxes: partial column boxes (d = 200), and gate_up_wgrad tiles straddling dW1 | dW3 (n = 200).
const TableShape kStoreCols = small({60, 4, 200, 256}, 777);
const TableShape kStoreStraddle = small({60, 4, 200, 200}, 777, Activation::geglu);
// 192-wide tiles: exact, ragged and skewed columns.
const TableShape k192 = small({8, 2, 384, 192}, 300);
const TableShape k192Ragged = small({60, 4, 448, 320}, 777, Activation::geglu);
const TableShape k192Skewed = small({64, 8, 576, 192}, 1000, Activation::swiglu, RoutingDistribution::skewed);
const TableShape kAccumulate = small({8, 2, 256, 128}, 300, Activation::swiglu, RoutingDistribution::random, true);

// ---- tile kinds -----------------------------------------------------------------------

TileKind forced(std::string name, std::string what, std::vector<std::string> pairs) {
  TileKind k{std::move(name), std::move(what), {}};
  k.tiles = [pairs = std::move(pairs)](const LayerConfig&, int64_t) {
    std::map<KernelFamily, TileConfig> out;
    for (const std::string& p : pairs) {
      const auto eq = p.find('=');
      if (eq == std::string::npos) throw InvalidArgument("tile table", "'" + p + "' is not FAMILY=TILE");
      out[parse_family(p.substr(0, eq))] = TileConfig::parse(p.substr(eq + 1));
    }
    return out;
  };
  return k;
}

// Every GEMM family on one wgmma mainloop: "_wgmma" (shared cp.async pipeline), "_ws"
// (warp-specialised) or "_persist" (the router GEMMs, one tile per block, run "_ws").
TileKind wgmma_kind(const std::string& suffix) {
  const std::string router = suffix == "_persist" ? "_ws" : suffix;
  const std::string wide = suffix == "_persist" ? "256" : "128";
  std::vector<std::string> pairs = {"gate_up=128x128x64_w8x1_s3" + suffix, "down_proj=128x256x64_w8x1_s3" + suffix,
                                    "router_logits=128x64x64_w8x1_s4" + router};
  for (const char* f : {"down_dgrad", "down_wgrad", "gate_up_wgrad", "gate_up_dgrad"})
    pairs.push_back(fmt::format("{}=128x{}x64_w8x1_s4{}", f, wide, suffix));
  for (const char* f : {"router_dgrad", "router_wgrad"}) pairs.push_back(fmt::format("{}=128x128x64_w8x1_s4{}", f, router));
  return forced(suffix.substr(1), "every GEMM family on " + suffix + " tiles", pairs);
}

// A rule over the default tiles of every tiled family the layer has: `change` turns a
// family's default into the kind's tile, or returns false to leave the family out. Tiles the
// layer cannot take are left out too (the kind then covers the families it can).
TileKind from_defaults(std::string name, std::string what, Arch arch,
                       std::function<bool(KernelFamily, const LayerConfig&, TileConfig&)> change) {
  TileKind k{std::move(name), std::move(what), {}};
  k.tiles = [arch, change](const LayerConfig& layer, int64_t T) {
    std::map<KernelFamily, TileConfig> out;
    for (const KernelSpec& s : layer_kernel_specs(layer, arch, T)) {
      if (!is_tiled(s.family)) continue;
      TileConfig t = s.tile;
      if (change(s.family, layer, t) && legality_problem(KernelSpec{s.family, layer, t, Arch::sm_90a}).empty())
        out[s.family] = t;
    }
    return out;
  };
  return k;
}

// The expert GEMMs on one ping-pong tile (two consumer warpgroups on alternate tiles), TMA for
// the operands that are not gathered; bn counts W1 and W3 together for the gated gate_up.
TileKind pingpong_kind(std::string name, std::string what, int bm, int bn, int stages, bool tma_store, int cluster) {
  return from_defaults(std::move(name), std::move(what), Arch::sm_90a,
                       [=](KernelFamily f, const LayerConfig& l, TileConfig& t) {
                         if (!supports_persistent(f)) return false;
                         const bool wgrad = f == KernelFamily::gate_up_wgrad || f == KernelFamily::down_wgrad;
                         if (tma_store && !wgrad) return false;
                         t = pingpong_tile(bm, bn / stacked_b_tiles(f, l.activation), stages);
                         t.tma_contiguous = true;
                         t.tma_store = tma_store;
                         t.cluster_m = cluster;
                         return true;
                       });
}

const TileKind kDefaults{"defaults", "the default tiles", [](const LayerConfig&, int64_t) {
                           return std::map<KernelFamily, TileConfig>{};
                         }};
const TileKind kWgmma = wgmma_kind("_wgmma");
const TileKind kWs = wgmma_kind("_ws");
const TileKind kPersist = wgmma_kind("_persist");
// Warp-specialised (or persistent) tiles with TMA loads for some families: FAMILY:WIDTH pairs.
TileKind tma_kind(std::string name, const std::string& families, const std::vector<std::string>& family_widths,
                  bool persistent) {
  std::vector<std::string> pairs;
  for (const std::string& fw : family_widths) {
    const auto colon = fw.find(':');
    pairs.push_back(fmt::format("{}=128x{}x64_w8x1_s4_{}_tmacontig", fw.substr(0, colon), fw.substr(colon + 1),
                                persistent ? "persist" : "ws"));
  }
  return forced(std::move(name), families + (persistent ? ": persistent" : ": warp-specialised") + ", TMA loads", pairs);
}

const std::vector<std::string> kProjections = {"gate_up:128", "down_proj:256"};
const std::vector<std::string> kWgrads = {"gate_up_wgrad:256", "down_wgrad:256"};
const std::vector<std::string> kDgrads = {"gate_up_dgrad:256", "down_dgrad:256"};
const TileKind kTma = tma_kind("tma", "gate_up, down_proj", kProjections, false);
const TileKind kTmaP = tma_kind("tma-persistent", "gate_up, down_proj", kProjections, true);
const TileKind kTmaWgrad = tma_kind("tma-wgrad", "gate_up_wgrad (dH), down_wgrad (hg)", kWgrads, false);
const TileKind kTmaWgradP = tma_kind("tma-wgrad-persistent", "gate_up_wgrad, down_wgrad", kWgrads, true);
const TileKind kTmaDgrad = tma_kind("tma-dgrad", "gate_up_dgrad, down_dgrad", kDgrads, false);
const TileKind kTmaDgradP = tma_kind("tma-dgrad-persistent", "gate_up_dgrad, down_dgrad", kDgrads, true);
const TileKind kDgradWs256 = forced("dgrad-ws256", "down_dgrad: warp-specialised 128x256, cp.async loads",
                                    {"down_dgrad=128x256x64_w8x1_s4_ws"});
const TileKind k192Wide = forced("bn192", "192-wide tiles: down_proj, gate_up_dgrad, gate_up_wgrad",
                                 {"down_proj=128x192x64_w8x1_s4_persist_tmacontig", "gate_up_dgrad=128x192x64_w8x1_s4_ws_tmacontig",
                                  "gate_up_wgrad=128x192x64_w8x1_s4_persist_tmacontig"});
// Widths between the 64-column steps (gate_up and down_proj only): W1 | W3 2 x 96 in one
// m64n192 and down_proj 160 (gpt-oss-20b's 2880 = 30 x 96 = 18 x 160); gate_up 2 x 160 as two
// m64n160 and down_proj 208 / 224.
const TileKind kNarrowStep = forced("bn-narrow", "gate_up 128x(2x96), down_proj 128x160, TMA loads, register stores",
                                    {"gate_up=128x96x64_w8x1_s5_persist_tmacontig", "down_proj=128x160x64_w8x1_s5_persist_tmacontig"});
const TileKind kNarrowStepWide = forced("bn-narrow-wide", "gate_up 128x(2x160), down_proj 128x208, TMA loads, register stores",
                                        {"gate_up=128x160x64_w8x1_s4_persist_tmacontig", "down_proj=128x208x64_w8x1_s4_persist_tmacontig"});
const TileKind kNarrowStep224 = forced("bn-224", "down_proj 128x224, TMA loads, register stores",
                                       {"down_proj=128x224x64_w8x1_s4_persist_tmacontig"});
// A ping-pong warpgroup holding a whole 128 x 192 tile (the 56 / 224 register split): gate_up's
// W1 | W3 of 2 x 96 (QuACK's gate_up shape), alone and as a 2 x 1 cluster, and down_proj 128 x 192;
// down_proj 160 as a cluster pair (80-row half boxes).
const TileKind kPingpongWide = forced("pingpong-wide", "gate_up 128x(2x96), down_proj 128x192: ping-pong, TMA loads",
                                      {"gate_up=128x96x64_w4x1_s5_pingpong_tmacontig", "down_proj=128x192x64_w4x1_s5_pingpong_tmacontig"});
const TileKind kPingpongWideCluster =
    forced("pingpong-wide-cluster", "gate_up 128x(2x96) ping-pong and down_proj 128x160 as cluster pairs",
           {"gate_up=128x96x64_w4x1_s5_pingpong_tmacontig_cluster2x1", "down_proj=128x160x64_w8x1_s4_persist_tmacontig_cluster2x1"});
const TileKind kTmaStore = forced("tmastore", "gate_up_wgrad, down_wgrad: TMA-store epilogue, persistent 128x256",
                                {"gate_up_wgrad=128x256x64_w8x1_s3_persist_tmacontig_tmastore",
                                 "down_wgrad=128x256x64_w8x1_s3_persist_tmacontig_tmastore"});
const TileKind kTmaStoreMixed = forced("tmastore-mixed", "TMA-store epilogue: 128x128 persistent, and cp.async loads",
                                     {"gate_up_wgrad=128x128x64_w8x1_s4_persist_tmacontig_tmastore",
                                      "down_wgrad=128x256x64_w8x1_s3_ws_tmastore"});
const TileKind kDgradWide = forced("dgrad-wide", "down_dgrad: persistent 128x256, TMA loads",
                                   {"down_dgrad=128x256x64_w8x1_s4_persist_tmacontig"});
const TileKind kDgrad128 = forced("dgrad-128", "down_dgrad: persistent 128x128, TMA loads",
                                  {"down_dgrad=128x128x64_w8x1_s4_persist_tmacontig"});
const TileKind kAltOrder = from_defaults("altorder", "the default tiles of the expert GEMMs in the other tile order",
                                         Arch::sm_90a, [](KernelFamily f, const LayerConfig&, TileConfig& t) {
                                           if (!supports_persistent(f) || !t.wgmma()) return false;
                                           t.alt_order = true;
                                           return true;
                                         });
const TileKind kMmaSync = from_defaults("mma-sync", "every GEMM family on its mma.sync tile (the sm_80 path)",
                                        parse_arch("sm_80"), [](KernelFamily, const LayerConfig&, TileConfig&) { return true; });
const TileKind kPingpong = pingpong_kind("pingpong", "expert GEMMs: ping-pong 128x128, 6 stages, TMA loads", 128, 128,
                                         6, false, 1);
const TileKind kPingpong64 = pingpong_kind("pingpong-64", "expert GEMMs: ping-pong 64x256, 5 stages, TMA loads", 64, 256,
                                           5, false, 1);
const TileKind kPingpongTmaStore = pingpong_kind("pingpong-tmastore", "weight gradients: ping-pong 128x128, TMA-store epilogue",
                                               128, 128, 4, true, 1);
const TileKind kClusterPair = from_defaults("cluster-pair", "slot-tiled GEMMs: the persistent TMA default as a cluster pair",
                                            Arch::sm_90a, [](KernelFamily f, const LayerConfig&, TileConfig& t) {
                                              // gate_up's default is the kernel layer's (no pairs for
                                              // its gathered families): pair its hand-written tile.
                                              if (t.cute && f == KernelFamily::gate_up)
                                                t = wgmma_tile(128, 128, 4, Mainloop::persistent);
                                              if (!supports_persistent(f) || !t.warp_specialized()) return false;
                                              t.tma_contiguous = true;
                                              if (t.mainloop == Mainloop::warp_specialized) t.mainloop = Mainloop::persistent;
                                              t.cluster_m = 2;
                                              t.direct_arrive = false;  // pairs run the polling producer
                                              return true;
                                            });
// 256-row warp-specialised tiles: two consumer warpgroups of 128 rows (two m64 slabs) each, the
// tile shape QuACK's autotuner picks for these GEMMs; the weight gradients' form halves the
// gathered B loads per FLOP.
const TileKind kTwoSlab256 = forced("two-slab-256", "down_proj, gate_up_dgrad: 256x128, two m64 slabs a warpgroup, TMA loads",
                                    {"down_proj=256x128x64_w8x1_s4_persist_tmacontig",
                                     "gate_up_dgrad=256x128x64_w8x1_s4_ws_tmacontig"});
const TileKind kTwoSlab256Wgrad = forced("two-slab-256-wgrad", "weight gradients: 256x128, two m64 slabs a warpgroup, TMA store",
                                         {"gate_up_wgrad=256x128x64_w8x1_s3_persist_tmacontig_tmastore",
                                          "down_wgrad=256x128x64_w8x1_s3_persist_tmacontig_tmastore"});
// The per-slot outputs (down_proj's o, gate_up_dgrad's dxs) by the TMA-store epilogue: full
// tiles by TMA, an expert's last partial tile by register stores (skewed and ragged shapes mix both).
const TileKind kSlotTmaStore = forced("slot-tmastore", "down_proj, gate_up_dgrad: TMA-store epilogue, persistent 128x256",
                                      {"down_proj=128x256x64_w8x1_s3_persist_tmacontig_tmastore",
                                       "gate_up_dgrad=128x256x64_w8x1_s3_persist_tmacontig_tmastore"});
// The TMA-store epilogue staged 64 columns at a time in two buffers, beside four stages, on
// the weight gradients and the per-slot outputs.
const TileKind kTmaStore64 = forced("tmastore64", "TMA-store epilogue in 64-column blocks, persistent 128x256, 4 stages",
                                    {"gate_up_wgrad=128x256x64_w8x1_s4_persist_tmacontig_tmastore64",
                                     "down_wgrad=128x256x64_w8x1_s4_persist_tmacontig_tmastore64",
                                     "down_proj=128x256x64_w8x1_s4_persist_tmacontig_tmastore64",
                                     "gate_up_dgrad=128x256x64_w8x1_s4_persist_tmacontig_tmastore64"});
// The warp-specialised pipeline with the producer's cp.async arrivals on the full barrier: the
// default tiles of the expert GEMMs (the warp-specialised ones) switched to it.
const TileKind kDirectArrive = from_defaults("direct-arrive", "the default warp-specialised tiles with _directarrive",
                                             Arch::sm_90a, [](KernelFamily f, const LayerConfig&, TileConfig& t) {
                                               if (!supports_persistent(f) || !t.warp_specialized()) return false;
                                               t.direct_arrive = true;
                                               return true;
                                             });
const TileKind kClusterPingpong = pingpong_kind("cluster-pingpong", "slot-tiled GEMMs: ping-pong 64x256 as a cluster pair",
                                                64, 256, 5, false, 2);

struct KindRows {
  const TileKind& kind;
  // The first is the kind's fast row; the others, every one in the other checkpoint mode too,
  // and the presets (save-h) are the full sweep's.
  std::vector<std::pair<TableShape, CheckpointMode>> small;
  std::vector<std::string> presets;
};

const CheckpointMode kSaveH = CheckpointMode::save_h, kRecompute = CheckpointMode::recompute;

std::vector<KindRows> table() {
  const std::vector<std::string> suite = {"mixtral-8x7b", "gpt-oss-20b", "olmoe-1b-7b",
                                          "qwen3-30b-a3b", "deepseek-v3", "qwen3-next-80b"};
  return {
      {kDefaults, {{kChunkedSkewed, kSaveH}, {kChunkedGelu, kRecompute}}, suite},
      {kWgmma, {{kSmall, kSaveH}, {kSkewed, kSaveH}, {kRagged, kRecompute}}, {"qwen3-30b-a3b"}},
      {kWs, {{kSmall, kSaveH}, {kSkewed, kSaveH}, {kRagged, kRecompute}}, {"qwen3-30b-a3b"}},
      {kPersist, {{kSmall, kSaveH}, {kSkewed, kSaveH}, {kRagged, kRecompute}}, {"qwen3-30b-a3b"}},
      {kTma, {{kSmall, kSaveH}, {kRagged, kRecompute}}, {"gpt-oss-20b", "mixtral-8x7b"}},
      {kTmaP, {{kSmall, kSaveH}, {kSkewedSilu, kSaveH}}, {"gpt-oss-20b", "mixtral-8x7b"}},
      {kTmaWgrad, {{kSmall, kSaveH}, {kRagged, kSaveH}}, {"qwen3-next-80b", "mixtral-8x7b"}},
      {kTmaWgradP, {{kSmall, kSaveH}, {kSkewedSilu, kSaveH}}, {}},
      {kTmaDgrad, {{kSmall, kSaveH}, {kRaggedTma, kSaveH}}, {"qwen3-next-80b", "mixtral-8x7b"}},
      {kTmaDgradP, {{kSmall, kSaveH}, {kSkewedSilu, kSaveH}}, {}},
      {kDgradWs256, {{kSmall, kSaveH}, {kSkewedGelu, kSaveH}, {kChunked, kSaveH}}, {"mixtral-8x7b", "qwen3-next-80b"}},
      {k192Wide, {{k192, kSaveH}, {k192Ragged, kSaveH}, {k192Skewed, kSaveH}}, {"gpt-oss-20b"}},
      {kNarrowStep, {{kSmall, kSaveH}, {kRagged, kRecompute}, {kSkewed, kSaveH}, {kChunked, kSaveH}}, {"gpt-oss-20b", "qwen3-30b-a3b"}},
      {kNarrowStepWide, {{kSmall, kSaveH}, {kRagged, kSaveH}, {kSkewedSilu, kSaveH}}, {"gpt-oss-20b"}},
      {kNarrowStep224, {{kRagged, kSaveH}, {kSkewed, kSaveH}}, {"gpt-oss-20b"}},
      {kTmaStore,
       {{kSmall, kSaveH}, {kStoreCols, kSaveH}, {kStoreStraddle, kSaveH}, {kSkewedSilu, kSaveH},
        {kChunkedSkewed, kSaveH}, {kAccumulate, kSaveH}},
       {"gpt-oss-20b", "mixtral-8x7b"}},
      {kTmaStoreMixed, {{kStoreStraddle, kRecompute}}, {}},
      {kDgradWide,
       {{kSmall, kSaveH}, {kRagged192, kSaveH}, {kSkewedSilu, kSaveH}, {kChunkedSkewed, kSaveH},
        {kChunkedGelu, kRecompute}},
       {"gpt-oss-20b", "mixtral-8x7b"}},
      {kDgrad128, {{kSmall, kSaveH}, {kRagged192, kSaveH}}, {}},
      {kAltOrder, {{kSmall, kSaveH}, {kSkewed, kSaveH}, {kRagged, kRecompute}}, {"qwen3-30b-a3b"}},
      {kPingpong, {{kSmall, kSaveH}, {kSkewed, kSaveH}, {kRaggedTma, kRecompute}}, {"qwen3-30b-a3b", "mixtral-8x7b"}},
      {kPingpong64, {{kSmall, kSaveH}, {kSkewedSilu, kSaveH}}, {"qwen3-30b-a3b"}},
      {kPingpongTmaStore, {{kSmall, kSaveH}, {kStoreStraddle, kSaveH}, {kAccumulate, kSaveH}}, {"deepseek-v3"}},
      {kClusterPair, {{kSmall, kSaveH}, {kSkewed, kSaveH}, {kRaggedTma, kRecompute}}, {"qwen3-30b-a3b", "gpt-oss-20b"}},
      {kClusterPingpong, {{kSmall, kSaveH}, {kChunkedSkewed, kSaveH}}, {"qwen3-30b-a3b"}},
      {kPingpongWide, {{kSmall, kSaveH}, {kSkewed, kSaveH}, {kRaggedTma, kRecompute}, {kChunked, kSaveH}}, {"qwen3-30b-a3b", "mixtral-8x7b"}},
      {kPingpongWideCluster, {{kSmall, kSaveH}, {kSkewed, kSaveH}, {kChunkedSkewed, kSaveH}}, {"qwen3-30b-a3b", "gpt-oss-20b"}},
      {kSlotTmaStore,
       {{kSkewed, kSaveH}, {kSmall, kRecompute}, {kRaggedTma, kSaveH}, {kStoreCols, kSaveH}, {kSkewedSilu, kSaveH}},
       {"mixtral-8x7b", "gpt-oss-20b"}},
      {kDirectArrive,
       {{kSkewed, kSaveH}, {kRaggedTma, kRecompute}, {kAccumulate, kSaveH}, {kChunkedSkewed, kSaveH}},
       {"qwen3-30b-a3b", "mixtral-8x7b"}},
      {kTmaStore64,
       {{kSkewed, kSaveH}, {kStoreCols, kSaveH}, {kAccumulate, kSaveH}, {kSkewedSilu, kRecompute}},
       {"mixtral-8x7b", "deepseek-v3"}},
      {kTwoSlab256Wgrad,
       {{kSkewed, kSaveH}, {kStoreCols, kSaveH}, {kStoreStraddle, kSaveH}, {kAccumulate, kSaveH}, {kChunkedSkewed, kSaveH}},
       {"deepseek-v3", "mixtral-8x7b"}},
      {kTwoSlab256, {{kSmall, kSaveH}, {kSkewed, kSaveH}, {kRaggedTma, kRecompute}, {kStoreCols, kSaveH}},
       {"qwen3-30b-a3b", "mixtral-8x7b"}},
  };
}

CheckpointMode other(CheckpointMode m) { return m == kSaveH ? kRecompute : kSaveH; }

}  // namespace

std::string TableRow::name() const { return kind.name + " / " + shape.name + " / " + to_string(mode); }

std::vector<TableRow> fast_rows() {
  std::vector<TableRow> rows;
  for (const KindRows& k : table()) rows.push_back({k.kind, k.small.front().first, k.small.front().second});
  return rows;
}

std::vector<TableRow> sweep_rows() {
  std::vector<TableRow> rows;
  for (const KindRows& k : table()) {
    for (size_t i = 0; i < k.small.size(); ++i) {
      const auto& [shape, mode] = k.small[i];
      if (i > 0) rows.push_back({k.kind, shape, mode});
      rows.push_back({k.kind, shape, other(mode)});
    }
    for (const std::string& p : k.presets) rows.push_back({k.kind, preset(p), kSaveH});
  }
  for (const TableShape& s : {kSmall, kSkewed}) rows.push_back({kMmaSync, s, kSaveH});
  rows.push_back({kMmaSync, kRagged, kRecompute});
  return rows;
}

LayerCheckOptions check_options(const TableRow& row) {
  LayerCheckOptions o;
  o.layer = row.shape.layer;
  o.tokens = row.shape.tokens;
  o.mode = row.mode;
  o.routing = row.shape.routing;
  o.accumulate_fp32 = row.shape.accumulate_fp32;
  o.force = row.kind.tiles(row.shape.layer, row.shape.tokens);
  // Every other tiled family on its default, forced too: a cache's tuned winners then never
  // change what a row runs, whatever cache it compiles into.
  for (const KernelSpec& s : layer_kernel_specs(o.layer, Arch::sm_90a, o.tokens))
    if (is_tiled(s.family)) o.force.emplace(s.family, s.tile);
  return o;
}

}  // namespace moeblaze::tables
