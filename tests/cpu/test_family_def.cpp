// generator/family_def.hpp against the formulas it replaced, kept here verbatim as the
// reference: the launch sizes runtime/moe_layer.cpp computed by hand, the flops of
// tuner/timing.cpp and the output columns of generator/heuristics.cpp. No GPU checks the
// launches on a CPU machine, so each must agree exactly, on every preset, token count and tile.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/checked.hpp"
#include "core/errors.hpp"
#include "generator/cost_model.hpp"
#include "generator/embedded_templates.hpp"
#include "generator/family_def.hpp"
#include "generator/heuristics.hpp"
#include "generator/kernel_layer.hpp"
#include "runtime/kernel_set.hpp"
#include "runtime/layer_buffers.hpp"
#include "runtime/moe_layer.hpp"
#include "tuner/timing.hpp"

using namespace moeblaze;

namespace {

// ---- the reference: the formulas as they were -------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int padded_experts(int e) { return (e + 7) / 8 * 8; }

// runtime/moe_layer.cpp
int64_t chunk_tile_blocks(int64_t slots, int bm, int bn, int experts, int n_out) {
  return (ceil_div(slots, int64_t{bm}) + 2 * int64_t{experts}) * ceil_div(int64_t{n_out}, int64_t{bn});
}

// tuner/timing.cpp
double old_family_flops(KernelFamily f, const LayerConfig& l, int64_t T) {
  const double TK = double(T) * l.shape.topk, d = l.shape.hidden, n = l.shape.ffn, E = l.shape.experts;
  const double G = l.gate_parts();
  switch (f) {
    case KernelFamily::gate_up: return 2 * TK * d * n * G;
    case KernelFamily::down_proj: return 2 * TK * d * n;
    case KernelFamily::down_dgrad: return 2 * TK * d * n;
    case KernelFamily::down_wgrad: return 2 * TK * d * n;
    case KernelFamily::gate_up_wgrad: return 2 * TK * d * n * G;
    case KernelFamily::gate_up_dgrad: return 2 * TK * d * n * G;
    case KernelFamily::router_logits:
    case KernelFamily::router_dgrad:
    case KernelFamily::router_wgrad: return 2 * double(T) * d * E;
    default: return 0;
  }
}

// tuner/timing.cpp (now each family's min_bytes in generator/families/)
double old_family_min_bytes(KernelFamily f, const LayerConfig& l, int64_t T) {
  const double TK = double(T) * l.shape.topk, d = l.shape.hidden, n = l.shape.ffn, E = l.shape.experts;
  const double G = l.gate_parts(), W = E * n * d * 2;  // one weight matrix, bytes
  switch (f) {
    case KernelFamily::gate_up: return T * d * 2 + G * W + TK * n * 2 * (G + 1);
    case KernelFamily::down_proj: return TK * n * 2 + W + TK * d * 2;
    case KernelFamily::combine: return TK * d * 2 + T * d * 2;
    case KernelFamily::down_dgrad: return T * d * 2 + W + TK * n * 2 * G * 2 + TK * n * 2;
    case KernelFamily::down_wgrad: return T * d * 2 + TK * n * 2 + W;
    case KernelFamily::gate_up_wgrad: return TK * n * 2 * G + T * d * 2 + G * W;
    case KernelFamily::gate_up_dgrad: return TK * n * 2 * G + G * W + TK * d * 2;
    case KernelFamily::router_logits: return T * d * 2 + E * d * 2 + T * E * 4;
    default: return 0;
  }
}

// generator/heuristics.cpp
int old_output_columns(KernelFamily f, const LayerConfig& l) {
  switch (f) {
    case KernelFamily::gate_up:
    case KernelFamily::down_dgrad:
    case KernelFamily::down_wgrad: return l.shape.ffn;
    case KernelFamily::down_proj:
    case KernelFamily::gate_up_dgrad:
    case KernelFamily::gate_up_wgrad: return l.shape.hidden;
    default: return 0;
  }
}

// ---- what the checks run over ----------------------------------------------------------

// Every preset as it is, with the fused gate_up layout, and with a plain activation (G = 1).
std::vector<LayerConfig> layers() {
  std::vector<LayerConfig> out;
  for (const Preset& p : presets()) {
    out.push_back(p.layer);
    LayerConfig fused = p.layer;
    fused.weight_layout = WeightLayout::fused_gate_up;
    out.push_back(fused);
    LayerConfig plain = p.layer;
    plain.activation = Activation::gelu;
    out.push_back(plain);
  }
  return out;
}

std::vector<int64_t> token_counts(const LayerConfig& l) {
  std::vector<int64_t> out = {0, 1, 7, 128, 4097, 16384, 32768};
  for (const Preset& p : presets())
    if (p.layer.shape.experts == l.shape.experts && p.layer.shape.hidden == l.shape.hidden) out.push_back(p.tokens);
  return out;
}

std::vector<TileConfig> tiles(KernelFamily f, const LayerConfig& l, int64_t T) {
  std::vector<TileConfig> out = {default_tile(f, l, Arch::sm_90a, T),
                                 TileConfig{},
                                 wgmma_tile(64, 128, 4),
                                 wgmma_tile(128, 128, 4),
                                 wgmma_tile(128, 256, 4, Mainloop::persistent),
                                 wgmma_tile(256, 128, 4, Mainloop::persistent),
                                 wgmma_tile(128, 96, 4),
                                 wgmma_tile(128, 192, 4),
                                 pingpong_tile(128, 160, 4),
                                 kernel_layer_tile(128, 128, 4, Mainloop::persistent, 2),
                                 kernel_layer_tile(128, 256, 3, Mainloop::pingpong, 2)};
  return out;
}

const KernelFamily kExpertGemms[] = {KernelFamily::gate_up,       KernelFamily::down_proj,
                                     KernelFamily::down_dgrad,    KernelFamily::down_wgrad,
                                     KernelFamily::gate_up_wgrad, KernelFamily::gate_up_dgrad};

}  // namespace

TEST_CASE("family_def: every tiled family has one definition, in all_families' order, and no other family has one") {
  std::vector<KernelFamily> tiled;
  for (KernelFamily f : all_families())
    if (is_tiled(f)) tiled.push_back(f);
  std::vector<KernelFamily> defined;
  for (const FamilyDef& def : family_defs()) {
    defined.push_back(def.family);
    CHECK(std::string(def.gemm).find("M = ") != std::string::npos);
  }
  CHECK(defined == tiled);
  for (KernelFamily f : all_families()) {
    if (is_tiled(f)) {
      CHECK(family_def(f).family == f);
    } else {
      CHECK_THROWS_AS(family_def(f), InvalidArgument);
    }
  }
}

TEST_CASE("family_def: the expert GEMMs run on the kernel layer and in the cost model, the router's on neither") {
  const LayerConfig l = find_preset("qwen3-30b-a3b").layer;
  for (const FamilyDef& def : family_defs()) {
    const bool expert = std::find(std::begin(kExpertGemms), std::end(kExpertGemms), def.family) != std::end(kExpertGemms);
    CAPTURE(to_string(def.family));
    CHECK(def.modeled == expert);
    CHECK(has_cost_model(def.family) == expert);
    CHECK((def.kernel_layer != nullptr) == expert);
    CHECK((kernel_layer_family(def.family) == def.kernel_layer));
    // Only the expert GEMMs gather an operand (gate_up's and down_dgrad's A, the weight
    // gradients' activations), and never both.
    CHECK(!(def.gathered_a && def.gathered_b));
    if (!expert) {
      CHECK(!def.gathered());
      continue;
    }
    // The header it instantiates is one the library embeds, and its hooks answer for a legal tile.
    const KernelLayerDef& k = *def.kernel_layer;
    bool embedded = false;
    for (const EmbeddedTemplate& t : embedded_templates()) embedded |= std::string(t.name) == k.header;
    CHECK(embedded);
    CHECK(std::string(k.function).rfind("moeblaze::sm90::", 0) == 0);
    const KernelSpec spec{def.family, l, kernel_layer_tile(128, 128, 4, Mainloop::persistent)};
    CHECK(k.staging_bytes(spec) > 0);
    CHECK(k.problem(spec).empty());
    CHECK(!k.shape_arguments(spec).empty());
  }
}

TEST_CASE("family_def: the problems' M, N, K and the row kinds") {
  const LayerConfig l = find_preset("deepseek-v3").layer;  // E=256 K=8 d=7168 n=2048 swiglu
  const LaunchExtent step{.tokens = 100};
  auto dims = [&](KernelFamily f) {
    const GemmProblem p = family_problem(f, l, step);
    return std::vector<int64_t>{p.rows, p.cols, p.reduction, p.batch};
  };
  CHECK(dims(KernelFamily::gate_up) == std::vector<int64_t>{800, 4096, 7168, 256});
  CHECK(family_problem(KernelFamily::gate_up, l, step).tile_cols() == 2048);
  CHECK(dims(KernelFamily::down_proj) == std::vector<int64_t>{800, 7168, 2048, 256});
  CHECK(dims(KernelFamily::down_dgrad) == std::vector<int64_t>{800, 2048, 7168, 256});
  CHECK(dims(KernelFamily::down_wgrad) == std::vector<int64_t>{7168, 2048, 800, 256});
  CHECK(dims(KernelFamily::gate_up_wgrad) == std::vector<int64_t>{4096, 7168, 800, 256});
  CHECK(dims(KernelFamily::gate_up_dgrad) == std::vector<int64_t>{800, 7168, 4096, 256});
  CHECK(dims(KernelFamily::router_logits) == std::vector<int64_t>{100, 256, 7168, 1});
  CHECK(dims(KernelFamily::router_dgrad) == std::vector<int64_t>{100, 7168, 256, 1});
  CHECK(dims(KernelFamily::router_wgrad) == std::vector<int64_t>{256, 7168, 100, 1});
  for (KernelFamily f : kExpertGemms)
    CHECK(family_problem(f, l).m_kind == (is_slot_tiled(f) ? RowKind::expert_slots : RowKind::weight_rows));
  // A chunk narrows the slots or the output columns, nothing else.
  const GemmProblem chunk = family_problem(KernelFamily::down_proj, l, {.tokens = 100, .slot_chunk = 300});
  CHECK((chunk.rows == 300 && chunk.slot_chunk && chunk.cols == 7168));
  const GemmProblem cols = family_problem(KernelFamily::down_wgrad, l, {.tokens = 100, .col_chunk = 512});
  CHECK((cols.rows == 7168 && cols.cols == 512 && cols.reduction == 800 && !cols.slot_chunk));
}

// The forward and backward launch sequence of runtime/moe_layer.cpp, each launch's grid as it
// was computed there against family_tiles for the extent the launch now passes.
TEST_CASE("family_def: family_tiles gives every launch of forward and backward the grid moe_layer.cpp computed") {
  int64_t launches = 0;
  for (const LayerConfig& l : layers()) {
    const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn, G = l.gate_parts();
    for (int64_t T : token_counts(l)) {
      const int64_t TK = T * K;
      CAPTURE(l.describe());
      CAPTURE(T);
      auto tiles_of = [&](KernelFamily f, const TileConfig& t, const LaunchExtent& e) {
        ++launches;
        return family_tiles(KernelSpec{f, l, t, Arch::sm_90a}, e);
      };
      for (const TileConfig& ut : tiles(KernelFamily::gate_up, l, T)) {
        CAPTURE(ut.to_string());
        const detail::ForwardScratch fs(l, T);
        if (fs.chunk_slots >= TK) {
          CHECK(tiles_of(KernelFamily::gate_up, ut, {.tokens = T}) == slot_tile_blocks(TK, ut.bm, ut.bn, E, n));
        } else {
          for (int64_t lo = 0; lo < TK; lo += fs.chunk_slots) {
            const int64_t hi = std::min(TK, lo + fs.chunk_slots);
            CHECK(tiles_of(KernelFamily::gate_up, ut, {.tokens = T, .slot_chunk = hi - lo}) ==
                  chunk_tile_blocks(hi - lo, ut.bm, ut.bn, E, n));
          }
        }
        // The backward's recompute is one launch over all the slots.
        CHECK(tiles_of(KernelFamily::gate_up, ut, {.tokens = T}) == slot_tile_blocks(TK, ut.bm, ut.bn, E, n));
      }
      for (const TileConfig& dt : tiles(KernelFamily::down_proj, l, T)) {
        CAPTURE(dt.to_string());
        const detail::ForwardScratch fs(l, T);
        if (fs.chunk_slots >= TK) {
          CHECK(tiles_of(KernelFamily::down_proj, dt, {.tokens = T}) == slot_tile_blocks(TK, dt.bm, dt.bn, E, d));
        } else {
          for (int64_t lo = 0; lo < TK; lo += fs.chunk_slots) {
            const int64_t hi = std::min(TK, lo + fs.chunk_slots);
            CHECK(tiles_of(KernelFamily::down_proj, dt, {.tokens = T, .slot_chunk = hi - lo}) ==
                  chunk_tile_blocks(hi - lo, dt.bm, dt.bn, E, d));
          }
        }
      }
      const int hg_cols = backward_chunk_cols(l);
      for (const TileConfig& dg : tiles(KernelFamily::down_dgrad, l, T)) {
        CAPTURE(dg.to_string());
        if (hg_cols >= n) {
          CHECK(tiles_of(KernelFamily::down_dgrad, dg, {.tokens = T}) == slot_tile_blocks(TK, dg.bm, dg.bn, E, n));
        } else {
          for (int c0 = 0; c0 < n; c0 += hg_cols) {
            const int cols = std::min(hg_cols, n - c0);
            CHECK(tiles_of(KernelFamily::down_dgrad, dg, {.tokens = T, .col_chunk = cols}) ==
                  slot_tile_blocks(TK, dg.bm, dg.bn, E, cols));
          }
        }
      }
      for (const TileConfig& wt2 : tiles(KernelFamily::down_wgrad, l, T)) {
        CAPTURE(wt2.to_string());
        if (hg_cols >= n) {
          CHECK(tiles_of(KernelFamily::down_wgrad, wt2, {.tokens = T}) ==
                E * ceil_div(d, wt2.bm) * ceil_div(n, wt2.bn));
        } else {
          for (int c0 = 0; c0 < n; c0 += hg_cols) {
            const int cols = std::min(hg_cols, n - c0);
            CHECK(tiles_of(KernelFamily::down_wgrad, wt2, {.tokens = T, .col_chunk = cols}) ==
                  E * ceil_div(d, wt2.bm) * ceil_div(cols, wt2.bn));
          }
        }
      }
      for (const TileConfig& wt1 : tiles(KernelFamily::gate_up_wgrad, l, T)) {
        CAPTURE(wt1.to_string());
        CHECK(tiles_of(KernelFamily::gate_up_wgrad, wt1, {.tokens = T}) ==
              E * ceil_div(G * n, wt1.bm) * ceil_div(d, wt1.bn));
      }
      for (const TileConfig& ud : tiles(KernelFamily::gate_up_dgrad, l, T)) {
        CAPTURE(ud.to_string());
        CHECK(tiles_of(KernelFamily::gate_up_dgrad, ud, {.tokens = T}) == slot_tile_blocks(TK, ud.bm, ud.bn, E, d));
      }
      for (const TileConfig& lt : tiles(KernelFamily::router_logits, l, T)) {
        CAPTURE(lt.to_string());
        CHECK(tiles_of(KernelFamily::router_logits, lt, {.tokens = T}) == ceil_div(T, lt.bm) * ceil_div(E, lt.bn));
      }
      for (const TileConfig& rd : tiles(KernelFamily::router_dgrad, l, T)) {
        CAPTURE(rd.to_string());
        CHECK(tiles_of(KernelFamily::router_dgrad, rd, {.tokens = T}) == ceil_div(T, rd.bm) * ceil_div(d, rd.bn));
      }
      for (const TileConfig& rw : tiles(KernelFamily::router_wgrad, l, T)) {
        CAPTURE(rw.to_string());
        const size_t room = detail::BackwardScratch(l, T, CheckpointMode::save_h, 128).union_bytes;
        for (int splits : {1, 2, 3, 16, detail::router_wgrad_splits(T, E, d, rw.bm, rw.bn, rw.bk, room)}) {
          const int64_t tiles = ceil_div(padded_experts(E), rw.bm) * ceil_div(d, rw.bn);
          CHECK(tiles_of(KernelFamily::router_wgrad, rw, {.tokens = T, .splits = splits}) == tiles * splits);
        }
      }
    }
  }
  // The wide-h cases ran: mixtral-8x7b chunks its forward and backward.
  const LayerConfig mixtral = find_preset("mixtral-8x7b").layer;
  CHECK(forward_chunks(mixtral) > 1);
  CHECK(backward_chunk_cols(mixtral) < mixtral.shape.ffn);
  CHECK(launches > 10000);
}

// The launches go through KernelSet::launch_gemm: its tile count is family_tiles of the set's
// layer and of the tile each family's kernel was built with.
TEST_CASE("family_def: KernelSet::gemm_tiles counts with the set's layer and each kernel's own tile") {
  const LayerConfig l = find_preset("mixtral-8x7b").layer;
  std::vector<BuiltKernel> kernels;
  for (const KernelSpec& spec : layer_kernel_specs(l, Arch::sm_90a)) {
    BuiltKernel k;
    k.generated.spec = spec;
    if (spec.family == KernelFamily::down_wgrad) k.generated.spec.tile = wgmma_tile(256, 128, 4, Mainloop::persistent);
    kernels.push_back(k);
  }
  const KernelSet ks = KernelSet::from_kernels(l, kernels);
  for (KernelFamily f : all_families()) {
    if (!is_tiled(f)) continue;
    CAPTURE(to_string(f));
    const TileConfig& t = ks.get(f).generated.spec.tile;
    for (const LaunchExtent& e : {LaunchExtent{.tokens = 4097}, LaunchExtent{.tokens = 4097, .slot_chunk = 2049},
                                  LaunchExtent{.tokens = 4097, .col_chunk = 3584}, LaunchExtent{.tokens = 7, .splits = 2}})
      CHECK(ks.gemm_tiles(f, e) == family_tiles(family_problem(f, l, e), t));
  }
  CHECK(ks.gemm_tiles(KernelFamily::down_wgrad, {.tokens = 4097}) == 8 * ceil_div(4096, 256) * ceil_div(14336, 128));
}

TEST_CASE("family_def: family_flops is what tuner/timing.cpp computed, bit for bit, for every family") {
  for (const LayerConfig& l : layers())
    for (int64_t T : token_counts(l))
      for (KernelFamily f : all_families()) {
        CAPTURE(l.describe());
        CAPTURE(T);
        CAPTURE(to_string(f));
        const double was = old_family_flops(f, l, T), now = family_flops(f, l, T);
        CHECK(std::memcmp(&was, &now, sizeof was) == 0);
      }
  // Past 2^53 too, where the order of the products shows in the rounding.
  LayerConfig wide = find_preset("deepseek-v3").layer;
  wide.shape.hidden = wide.shape.ffn = kMaxWidth - 8;
  for (KernelFamily f : all_families()) {
    const double was = old_family_flops(f, wide, 1 << 27), now = family_flops(f, wide, 1 << 27);
    CHECK(std::memcmp(&was, &now, sizeof was) == 0);
  }
}

TEST_CASE("family_def: family_min_bytes is what tuner/timing.cpp computed, bit for bit, for every family") {
  for (const LayerConfig& l : layers())
    for (int64_t T : token_counts(l))
      for (KernelFamily f : all_families()) {
        CAPTURE(l.describe());
        CAPTURE(T);
        CAPTURE(to_string(f));
        const double was = old_family_min_bytes(f, l, T), now = family_min_bytes(f, l, T);
        CHECK(std::memcmp(&was, &now, sizeof was) == 0);
      }
}

TEST_CASE("family_def: output_columns is the columns of a family's output tiles, as heuristics.cpp listed them") {
  for (const LayerConfig& l : layers())
    for (KernelFamily f : all_families()) {
      CAPTURE(l.describe());
      CAPTURE(to_string(f));
      CHECK(output_columns(f, l) == old_output_columns(f, l));
    }
}
