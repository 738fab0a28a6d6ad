// down_proj on the kernel layer: o = h W2_e^T per slot, both operands by TMA (h's rows of the
// tile, W2_e's rows of the N tile), o stored by ragged TMA boxes. The problem policy names the
// tile schedule and where the operands and the output are; gemm_kernel does the rest.
#pragma once
#include "moeblaze/gemm/scheduler/tile_schedule.cuh"
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/sm90/gemm_kernel.cuh"

namespace moeblaze::sm90 {

template <class Cfg, int E, int D, int N, bool ALT_ORDER>
struct DownProjProblem {
  using Args = DownProjArgs;
  static constexpr int K_TILES = (N + Cfg::BK - 1) / Cfg::BK;
  using Tile = gemm::SlotTile;

  // A cluster pair's tile is 2 BM rows of one expert; block `rank` takes rows [rank BM, +BM).
  static MB_DEV Tile problem_tile(const Args& p, int index, int rank) {
    constexpr int ROWS = Cfg::BM * Cfg::CLUSTER_M;
    Tile t = p.slot_hi > 0 ? gemm::chunk_slot_tile<ROWS, Cfg::BN, E, D, ALT_ORDER>(index, p.rv.expert_token_offsets,
                                                                                 p.slot_lo, p.slot_hi)
                           : gemm::slot_tile<ROWS, Cfg::BN, E, D, ALT_ORDER>(index, p.rv.tile_prefix,
                                                                            p.rv.expert_token_offsets);
    if constexpr (Cfg::CLUSTER_M > 1) {
      t.slot0 += rank * Cfg::BM;
      t.rows = t.rows - rank * Cfg::BM;
      t.rows = t.rows < 0 ? 0 : t.rows > Cfg::BM ? Cfg::BM : t.rows;
    }
    return t;
  }
  // h rows from the h buffer's start (a forward chunk's h holds its slots from row 0); rows
  // past the tile's feed output rows the store clips. W2 as [E*d, n]: rows e*d + n0.
  static MB_DEV TmaOperands operands(const Args& p, const Tile& t) {
    return {&p.tma_h, t.slot0 - p.slot_lo, &p.tma_w2, t.expert * D + t.n0, K_TILES};
  }
  static MB_DEV RaggedTile output(const Args& p, const Tile& t) { return {&p.tma_o, t.n0, t.slot0, t.rows}; }
};

template <class Cfg, int E, int D, int N, bool ALT_ORDER>
MB_DEV void down_proj(const DownProjArgs& p) {
  gemm_kernel<Cfg, DownProjProblem<Cfg, E, D, N, ALT_ORDER>>(p);
}

}  // namespace moeblaze::sm90
