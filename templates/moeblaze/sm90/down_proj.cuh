// down_proj on the kernel layer: o = h W2_e^T per slot. A = h's rows of the tile and B = W2_e's
// rows of the N tile, both K-major by TMA; o leaves by ragged TMA stores. The problem policy
// names the schedule, the parts and where the operands and the output are; gemm_kernel does
// the rest.
#pragma once
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/sm90/epilogue_store.cuh"
#include "moeblaze/sm90/gemm_kernel.cuh"
#include "moeblaze/sm90/slot_tiles.cuh"

namespace moeblaze::sm90 {

template <class Cfg, int E, int D, int N, bool ALT_ORDER>
struct DownProjProblem {
  using Args = DownProjArgs;
  using Mainloop = TmaMainloop<Cfg>;
  using Epilogue = TmaStoreEpilogue<Cfg>;
  static constexpr bool K_STEPS_FIXED = true;

  static MB_DEV gemm::SlotTile problem_tile(const Args& p, int index, int rank) {
    return slot_pair_tile<Cfg, Cfg::BN, E, D, ALT_ORDER>(p.rv, index, rank, p.slot_lo, p.slot_hi);
  }
  static MB_DEV int k_tiles(const Args&, const gemm::SlotTile&) { return (N + 63) / 64; }  // TMA zero-fills past n
  // h rows from the h buffer's start (a forward chunk's h holds its slots from row 0); rows
  // past the tile's feed output rows the store clips. W2 as [E*d, n]: rows e*d + n0.
  static MB_DEV auto operands(const Args& p, const gemm::SlotTile& t) {
    return sm90::operands(TmaRowsK{&p.tma_h, t.slot0 - p.slot_lo}, TmaRowsK{&p.tma_w2, t.expert * D + t.n0},
                          k_tiles(p, t));
  }
  static MB_DEV RaggedTile epilogue(const Args& p, const gemm::SlotTile& t, int) {
    return {&p.tma_o, t.n0, t.slot0, t.rows};
  }
};

template <class Cfg, int E, int D, int N, bool ALT_ORDER>
MB_DEV void down_proj(const DownProjArgs& p) {
  gemm_kernel<Cfg, DownProjProblem<Cfg, E, D, N, ALT_ORDER>>(p);
}

}  // namespace moeblaze::sm90
