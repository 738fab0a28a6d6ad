// The weight gradients: down_wgrad (dW2 = gather(dy)^T hg) and gate_up_wgrad
// ([dW1; dW3] = [dA|dB]^T gather(x)), each a reduction over an expert's slots (ragged K), with
// the same staging and template arguments.
//
// Their ragged TMA source (sm90/operand_tma.cuh TmaRaggedColsMN) loads a stage's MN extent as
// 64-column boxes; a tile reaching past the extent (hg's n columns for down_wgrad, dH's G n for
// gate_up_wgrad) made those loads fault on an H100 (compute-sanitizer: illegal address in the
// TMA load, n = 128 under a 256-wide down_wgrad tile). The same fault in down_dgrad's H loads
// came from boxes that start past the map's last column (sm90/staging.cuh, live_boxes); the
// mainloop's stages expect a fixed byte count, so such tiles are refused rather than loaded box
// by box.
#include <fmt/format.h>

#include "families.hpp"

namespace moeblaze::families {
namespace {

double down_wgrad_min_bytes(const LayerConfig& l, int64_t tokens) {
  const auto [T, TK, d, n, E, G, W] = step_sizes(l, tokens);
  return T * d * 2 + TK * n * 2 + W;  // dy; hg; dW2
}

double gate_up_wgrad_min_bytes(const LayerConfig& l, int64_t tokens) {
  const auto [T, TK, d, n, E, G, W] = step_sizes(l, tokens);
  return TK * n * 2 * G + T * d * 2 + G * W;  // dH; x; dW1 and dW3
}

std::string down_wgrad_arguments(const KernelSpec& s) {
  const MoeShape& m = s.layer.shape;
  return fmt::format("{}, {}, {}, {}", m.experts, m.hidden, m.ffn, bool_literal(s.tile.alt_order));
}

std::string gate_up_wgrad_arguments(const KernelSpec& s) {
  const MoeShape& m = s.layer.shape;
  return fmt::format("{}, {}, {}, {}, {}", m.experts, m.hidden, m.ffn, activation_literal(s.layer.activation),
                     bool_literal(s.tile.alt_order));
}

// A down_wgrad pair gathers each block's dy rows and multicasts hg.
std::string down_wgrad_pair_problem(const KernelSpec& s) {
  if (s.tile.bn % 128) return "a down_wgrad pair splits hg's 64-column boxes between its blocks: bn 128 or 256";
  return {};
}

std::string down_wgrad_problem(const KernelSpec& s) {
  const int n = s.layer.shape.ffn;
  if (n % s.tile.bn)
    return fmt::format(
        "kernel-layer down_wgrad tiles need n % bn == 0 (n = {}, bn = {}): a column tile past n faults in the ragged hg loads",
        n, s.tile.bn);
  return {};
}

// gate_up_wgrad's gathered operand is B (x): it cannot be shared in a pair.
std::string gate_up_wgrad_pair_problem(const KernelSpec&) { return kGatheredPairRefusal; }

std::string gate_up_wgrad_problem(const KernelSpec& s) {
  const LayerConfig& l = s.layer;
  const int bm = s.tile.bm;
  if (l.gate_parts() * l.shape.ffn % bm)
    return fmt::format(
        "kernel-layer gate_up_wgrad tiles need G n % bm == 0 (G n = {}, bm = {}): a row tile past G n faults in the ragged dH loads",
        l.gate_parts() * l.shape.ffn, bm);
  // A row tile straddling dW1 | dW3 stores 64-row pieces, each inside one matrix
  // (sm90/epilogue_wgrad.cuh); a piece that itself straddled would need a store from a negative
  // row, which faults (illegal instruction in SM90_TMA_STORE_3D, H100).
  if (l.gate_parts() == 2 && l.shape.ffn % bm && l.shape.ffn % 64)
    return fmt::format(
        "kernel-layer gate_up_wgrad tiles need n % 64 == 0 where n % bm != 0 (n = {}, bm = {}): a row tile straddling "
        "dW1 | dW3 is stored in 64-row pieces",
        l.shape.ffn, bm);
  return {};
}

const KernelLayerDef kDownWgrad = {"moeblaze/sm90/wgrad.cuh", "moeblaze::sm90::down_wgrad", true, true,
                                   two_block_staging_bytes, down_wgrad_arguments, down_wgrad_pair_problem,
                                   down_wgrad_problem};
const KernelLayerDef kGateUpWgrad = {"moeblaze/sm90/wgrad.cuh", "moeblaze::sm90::gate_up_wgrad", true, true,
                                     two_block_staging_bytes, gate_up_wgrad_arguments, gate_up_wgrad_pair_problem,
                                     gate_up_wgrad_problem};

}  // namespace

const FamilyDef& down_wgrad() {
  static const FamilyDef def = {KernelFamily::down_wgrad,
                                "dW2 = gather(dy)^T hg: M = d, N = n per expert, K = the expert's slots",
                                RowKind::weight_rows, GemmDim::hidden, GemmDim::ffn, GemmDim::slots,
                                down_wgrad_min_bytes, true, 0, 1, true, false, &kDownWgrad};
  return def;
}

const FamilyDef& gate_up_wgrad() {
  static const FamilyDef def = {KernelFamily::gate_up_wgrad,
                                "[dW1; dW3] = [dA|dB]^T gather(x): M = G n, N = d per expert, K = the expert's slots",
                                RowKind::weight_rows, GemmDim::gated_ffn, GemmDim::hidden, GemmDim::slots,
                                gate_up_wgrad_min_bytes, true, 0, 1, false, true, &kGateUpWgrad};
  return def;
}

}  // namespace moeblaze::families
