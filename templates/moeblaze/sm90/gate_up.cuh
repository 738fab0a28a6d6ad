// gate_up on the kernel layer: [A|B] = gather(x) [W1_e; W3_e]^T per slot. A = x's rows of the
// tile's slots, gathered by the producer warpgroup (cp.async through expert_token_indices);
// B = W1_e's and W3_e's rows of the N tile stacked in one stage, K-major by TMA; the epilogue
// saves H and writes h (epilogue_gate_up.cuh). A tile covers BN / G columns of h.
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/sm90/epilogue_gate_up.cuh"
#include "moeblaze/sm90/gemm_kernel.cuh"
#include "moeblaze/sm90/slot_tiles.cuh"

namespace moeblaze::sm90 {

template <class Cfg, int E, int D, int N, Activation ACT, int W_ROWS, bool ALT_ORDER>
struct GateUpProblem {
  using Args = GateUpArgs;
  using Mainloop = sm90::Mainloop<Cfg, true>;
  using Epilogue = GateUpEpilogue<Cfg, ACT>;
  static constexpr bool K_STEPS_FIXED = true;
  static constexpr int G = gate_parts<ACT>(), NH = Epilogue::NH;

  static MB_DEV gemm::SlotTile problem_tile(const Args& p, int index, int rank) {
    return slot_pair_tile<Cfg, NH, E, N, ALT_ORDER>(p.rv, index, rank, p.slot_lo, p.slot_hi);
  }
  static MB_DEV int k_tiles(const Args&, const gemm::SlotTile&) { return (D + 63) / 64; }
  // W1 / W3 rows e * W_ROWS + n0 (rows past n read the next rows: their columns are not stored).
  static MB_DEV auto operands(const Args& p, const gemm::SlotTile& t) {
    const GatherRowsK x{static_cast<const Element*>(p.x), p.rv.expert_token_indices + t.slot0, t.rows, D, D};
    const int w_row = t.expert * W_ROWS + t.n0;
    if constexpr (G == 2) return sm90::operands(x, TmaRowsK2{{&p.tma_w1, &p.tma_w3}, w_row}, k_tiles(p, t));
    else return sm90::operands(x, TmaRowsK{&p.tma_w1, w_row}, k_tiles(p, t));
  }
  static MB_DEV typename Epilogue::Params epilogue(const Args& p, const gemm::SlotTile& t, int) {
    return {{p.H ? &p.tma_H_gate : nullptr, &p.tma_H_up}, p.h ? &p.tma_h_out : nullptr, t.n0, t.slot0, t.slot0 - p.slot_lo, t.rows};
  }
};

template <class Cfg, int E, int D, int N, Activation ACT, int W_ROWS, bool ALT_ORDER>
MB_DEV void gate_up(const GateUpArgs& p) {
  gemm_kernel<Cfg, GateUpProblem<Cfg, E, D, N, ACT, W_ROWS, ALT_ORDER>>(p);
}

}  // namespace moeblaze::sm90
