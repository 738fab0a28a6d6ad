#include "family_def.hpp"

#include <fmt/format.h>

#include "core/errors.hpp"
#include "families/families.hpp"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// router.cuh's padded_experts: dW_r's and d logits' rows of experts come in eights.
int64_t padded_experts(int64_t e) { return (e + 7) / 8 * 8; }

using D = GemmDim;

// In all_families' order.
const std::vector<FamilyDef>& defs() {
  static const std::vector<FamilyDef> all = {
      families::router_logits(), families::gate_up(),       families::down_proj(),
      families::down_dgrad(),    families::down_wgrad(),    families::gate_up_wgrad(),
      families::gate_up_dgrad(), families::router_dgrad(),  families::router_wgrad(),
  };
  return all;
}

int64_t size_of(GemmDim dim, const LayerConfig& l, const LaunchExtent& e) {
  switch (dim) {
    case D::slots: return e.slot_chunk > 0 ? e.slot_chunk : e.tokens * l.shape.topk;
    case D::tokens: return e.tokens;
    case D::hidden: return l.shape.hidden;
    case D::ffn: return l.shape.ffn;
    case D::gated_ffn: return int64_t{l.gate_parts()} * l.shape.ffn;
    case D::experts: return l.shape.experts;
  }
  return 0;
}

bool uses(const FamilyDef& def, GemmDim dim) { return def.m == dim || def.n == dim || def.k == dim; }

}  // namespace

const std::vector<FamilyDef>& family_defs() { return defs(); }

const FamilyDef& family_def(KernelFamily f) {
  for (const FamilyDef& def : defs())
    if (def.family == f) return def;
  throw InvalidArgument("family", fmt::format("{} is no tiled GEMM family", to_string(f)));
}

GemmProblem family_problem(KernelFamily f, const LayerConfig& l, const LaunchExtent& e) {
  const FamilyDef& def = family_def(f);
  GemmProblem p;
  p.m_kind = def.m_kind;
  p.parts = stacked_b_tiles(f, l.activation);
  p.rows = size_of(def.m, l, e);
  p.cols = e.col_chunk > 0 ? int64_t{e.col_chunk} * p.parts : size_of(def.n, l, e);
  p.reduction = size_of(def.k, l, e);
  const bool router = def.m_kind == RowKind::tokens || def.m_kind == RowKind::experts;
  p.batch = router ? 1 : l.shape.experts;
  p.slot_chunk = e.slot_chunk > 0 && uses(def, D::slots);
  p.splits = def.m_kind == RowKind::experts ? e.splits : 1;
  return p;
}

int64_t family_tiles(const GemmProblem& p, const TileConfig& t) {
  const int64_t col_tiles = ceil_div(p.tile_cols(), t.bn);
  switch (p.m_kind) {
    case RowKind::expert_slots:
      // The sum over experts of ceil(count / bm) is at most ceil(slots / bm) + E. A chunk of the
      // slots meets each expert in at most ceil(its slots there / bm) + 1 of its bm-aligned tiles
      // (gemm::chunk_slot_tile), hence 2 E.
      if (!p.slot_chunk)
        return slot_tile_blocks(p.rows, t.bm, t.bn, static_cast<int>(p.batch), static_cast<int>(p.tile_cols()));
      return (ceil_div(p.rows, t.bm) + 2 * p.batch) * col_tiles;
    case RowKind::weight_rows: return p.batch * ceil_div(p.rows, t.bm) * col_tiles;
    case RowKind::tokens: return ceil_div(p.rows, t.bm) * col_tiles;
    case RowKind::experts: return ceil_div(padded_experts(p.rows), t.bm) * col_tiles * p.splits;
  }
  return 0;
}

int64_t family_tiles(const KernelSpec& spec, const LaunchExtent& extent) {
  return family_tiles(family_problem(spec.family, spec.layer, extent), spec.tile);
}

double family_flops(KernelFamily f, const LayerConfig& l, int64_t tokens) {
  if (!is_tiled(f)) return 0;
  const FamilyDef& def = family_def(f);
  // 2 M N K multiplied in one order for every family (the rows of tokens or slots, d, n, G, E),
  // so a count past 2^53 rounds the same way whichever dimension is M.
  double flops = 2;
  if (uses(def, D::slots)) flops *= double(tokens) * l.shape.topk;
  if (uses(def, D::tokens)) flops *= double(tokens);
  if (uses(def, D::hidden)) flops *= double(l.shape.hidden);
  if (uses(def, D::ffn) || uses(def, D::gated_ffn)) flops *= double(l.shape.ffn);
  if (uses(def, D::gated_ffn)) flops *= double(l.gate_parts());
  if (uses(def, D::experts)) flops *= double(l.shape.experts);
  return flops;
}

}  // namespace moeblaze
