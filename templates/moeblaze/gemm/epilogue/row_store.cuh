// Per-slot output rows in bf16 (down_proj's expert outputs o, gate_up_dgrad's per-slot dx): tile
// row r is slot t.slot0 + r of a [slots, COLS] matrix, tile column c its column t.n0 + c.
// BIAS: the tile expert's row of bias [E, COLS] is added (down_proj of layers with expert biases).
#pragma once
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

}  // namespace moeblaze::gemm
