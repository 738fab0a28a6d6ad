// Per-slot output rows in bf16 (down_proj's expert outputs o, gate_up_dgrad's per-slot dx): tile
// row r is slot t.slot0 + r of a [slots, COLS] matrix, tile column c its column t.n0 + c.
// BIAS: the tile expert's row of bias [E, COLS] is added (down_proj of layers with expert biases).
//
// TMA-store tiles (`_tmastore`, no bias) stage a full tile and store it by TMA (store_slot_tile):
// the consumers go on to the next tile's mainloop while the stores drain. The last tile of an
// expert usually has fewer rows than BM; a box would write into the next expert's first rows,
// which another tile owns, so those tiles keep the register stores.
#pragma once
#include "moeblaze/gemm/epilogue/tma_store.cuh"
#include "moeblaze/gemm/fragment.cuh"
#include "moeblaze/gemm/scheduler/tile_schedule.cuh"

namespace moeblaze::gemm {

template <class Cfg, int COLS, bool BIAS = false>
MB_DEV void store_slot_rows(const float (&acc)[1][Cfg::MT][Cfg::NT][4], bf16_t* out, const SlotTile& t,
                            const void* bias = nullptr) {
  for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
    const int col = t.n0 + c;
    if (r >= t.rows || col >= COLS) return;
    if constexpr (BIAS) {
      const float2 b = load_bf16x2(static_cast<const bf16_t*>(bias) + static_cast<i64>(t.expert) * COLS + col);
      v0 += b.x;
      v1 += b.y;
    }
    store_bf16x2(out + static_cast<i64>(t.slot0 + r) * COLS + col, v0, v1);
  });
}

// Consumers only: the tile's rows of a [slots, COLS] matrix, by TMA (full tiles of a
// TMA-store config, map = the matrix as [1][slots][COLS]) or by register stores.
template <class Cfg, int COLS, bool BIAS = false>
MB_DEV void store_slot_tile(const float (&acc)[1][Cfg::MT][Cfg::NT][4], bf16_t* out, const TmaMap* map,
                            const SlotTile& t, const void* bias = nullptr) {
  if constexpr (Cfg::TMA_STORE && !BIAS) {
    if (t.rows == Cfg::BM) {
      tma_store_tile<Cfg>(acc, StoreTarget{map, t.slot0, t.n0, 0});
      return;
    }
  }
  store_slot_rows<Cfg, COLS, BIAS>(acc, out, t, bias);
}

}  // namespace moeblaze::gemm
