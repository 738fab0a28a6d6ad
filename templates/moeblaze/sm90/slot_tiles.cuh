// The slot-tiled families' schedule on the kernel layer: the tile numbering of
// gemm/scheduler/tile_schedule.cuh (expert by expert from the device-built tile_prefix), taken
// per cluster. A pair's tile is 2 BM rows of one expert; block `rank` takes rows [rank BM, +BM),
// clipped to the expert (a half past its rows has rows = 0: it loads its share of B and stores
// nothing). BN: the output columns a tile covers (gate_up's h columns: half its accumulator).
#pragma once
#include "moeblaze/gemm/scheduler/tile_schedule.cuh"
#include "moeblaze/sm90/config.cuh"

namespace moeblaze::sm90 {

// slot_hi > 0: only the slots [slot_lo, slot_hi) (a forward chunk of a wide-h layer);
// n_tiles > 0: only the N tiles [n_tile_lo, +n_tiles) (a backward column chunk).
template <class Cfg, int BN, int E, int N_OUT, bool ALT_ORDER>
MB_DEV gemm::SlotTile slot_pair_tile(const RoutingView& rv, int index, int rank, int slot_lo = 0, int slot_hi = 0,
                                     int n_tiles = 0, int n_tile_lo = 0) {
  constexpr int ROWS = Cfg::BM * Cfg::CLUSTER_M;
  gemm::SlotTile t =
      slot_hi > 0   ? gemm::chunk_slot_tile<ROWS, BN, E, N_OUT, ALT_ORDER>(index, rv.expert_token_offsets, slot_lo, slot_hi)
      : n_tiles > 0 ? gemm::slot_tile_cols<ROWS, BN, E, ALT_ORDER>(index, rv.tile_prefix, rv.expert_token_offsets, n_tiles, n_tile_lo)
                    : gemm::slot_tile<ROWS, BN, E, N_OUT, ALT_ORDER>(index, rv.tile_prefix, rv.expert_token_offsets);
  if constexpr (Cfg::CLUSTER_M > 1) {
    t.slot0 += rank * Cfg::BM;
    t.rows -= rank * Cfg::BM;
    t.rows = t.rows < 0 ? 0 : t.rows > Cfg::BM ? Cfg::BM : t.rows;
  }
  return t;
}

}  // namespace moeblaze::sm90
