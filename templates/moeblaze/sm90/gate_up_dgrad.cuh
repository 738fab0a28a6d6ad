// gate_up_dgrad on the kernel layer: dxs = [dA|dB] [W1_e; W3_e] per slot, one reduction over
// G*n. A = dH's rows of the tile, K-major by TMA; B = W1_e's, then W3_e's, k rows of the N tile's
// columns, MN-major by TMA ([64][64] boxes of the [E*W_ROWS, d] maps); dxs leaves by ragged TMA
// stores (the combine sums a token's K rows afterwards).
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/sm90/epilogue_store.cuh"
#include "moeblaze/sm90/gemm_kernel.cuh"
#include "moeblaze/sm90/slot_tiles.cuh"

namespace moeblaze::sm90 {

template <class Cfg, int E, int D, int N, Activation ACT, int W_ROWS, bool ALT_ORDER>
struct GateUpDgradProblem {
  using Args = GateUpDgradArgs;
  using Mainloop = TmaMainloop<Cfg>;
  using Epilogue = TmaStoreEpilogue<Cfg>;
  static constexpr bool K_STEPS_FIXED = true;
  static constexpr int G = gate_parts<ACT>();
  static_assert(N % 64 == 0, "W1 and W3 k stages stay inside one matrix");

  static MB_DEV gemm::SlotTile problem_tile(const Args& p, int index, int rank) {
    return slot_pair_tile<Cfg, Cfg::BN, E, D, ALT_ORDER>(p.rv, index, rank);
  }
  static MB_DEV int k_tiles(const Args&, const gemm::SlotTile&) { return G * N / 64; }
  static MB_DEV auto operands(const Args& p, const gemm::SlotTile& t) {
    return sm90::operands(TmaRowsK{&p.tma_dh, t.slot0},
                          TmaColsMN{{&p.tma_w1, G == 2 ? static_cast<const void*>(&p.tma_w3) : static_cast<const void*>(&p.tma_w1)},
                                    t.expert * W_ROWS, N, t.n0},
                          k_tiles(p, t));
  }
  static MB_DEV RaggedTile epilogue(const Args& p, const gemm::SlotTile& t, int) {
    return {&p.tma_dxs, t.n0, t.slot0, t.rows};
  }
};

template <class Cfg, int E, int D, int N, Activation ACT, int W_ROWS, bool ALT_ORDER>
MB_DEV void gate_up_dgrad(const GateUpDgradArgs& p) {
  gemm_kernel<Cfg, GateUpDgradProblem<Cfg, E, D, N, ACT, W_ROWS, ALT_ORDER>>(p);
}

}  // namespace moeblaze::sm90
