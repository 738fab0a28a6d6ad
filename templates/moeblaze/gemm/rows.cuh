// Row sources for the GEMM mainloop (see mainloop.cuh): how a tile row maps to memory.
// This is where gathers are fused: a row is either base + r*ld (contiguous) or
// base + idx[r]*ld (gathered through expert_token_indices).
#pragma once
#include "moeblaze/device.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::gemm {

struct Rows {
  const bf16_t* base;
  const int* idx;  // nullptr: contiguous rows
  int count;       // rows [0, count) exist
  i64 ld;          // elements between rows
  int limit;       // valid columns (see mainloop.cuh)
  MB_DEV const bf16_t* row(int r) const {
    if (r >= count) return nullptr;
    return base + (idx ? static_cast<i64>(idx[r]) : static_cast<i64>(r)) * ld;
  }
  MB_DEV const bf16_t* fallback() const { return base; }
  static constexpr bool kMayGather = true;
  // Whether rows [r0, r0 + n) all exist and are evenly spaced ld apart from row(r0): a
  // stage of such rows loads as one pointer plus a stride (TileLoader, MnMajorLoader).
  MB_DEV bool contiguous(int r0, int n) const { return idx == nullptr && r0 + n <= count; }
  // row(r) in two steps, so a gathered index can be loaded early and used later.
  MB_DEV int key(int r) const { return r < count ? (idx ? idx[r] : r) : -1; }
  MB_DEV const bf16_t* at(int key) const { return base + static_cast<i64>(key) * ld; }
};

// Rows [0, split) from base0, rows [split, count) from base1 (row r at base1 + (r-split)*ld).
// Stacks W1 on W3 along n (up forward, split = BN) or along k (up dgrad, split = n).
struct TwoPartRows {
  const bf16_t* base0;
  const bf16_t* base1;
  int split;
  int count0, count1;  // valid rows in each part
  i64 ld;
  int limit;
  MB_DEV const bf16_t* row(int r) const {
    if (r < split) return r < count0 ? base0 + static_cast<i64>(r) * ld : nullptr;
    r -= split;
    return r < count1 ? base1 + static_cast<i64>(r) * ld : nullptr;
  }
  // Rows [r0, r0 + n) all exist inside one part (see Rows::contiguous).
  MB_DEV bool contiguous(int r0, int n) const {
    return r0 + n <= split ? r0 + n <= count0 : r0 >= split && r0 + n - split <= count1;
  }
  MB_DEV const bf16_t* fallback() const { return base0; }
  // Never gathered: its MN-major tiles load through TileLoader directly (StageLoader).
  static constexpr bool kMayGather = false;
};

// Dynamic shared memory, 128-byte aligned, shared by every kernel of a translation unit.
MB_DEV bf16_t* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char moeblaze_smem[];
  return reinterpret_cast<bf16_t*>(moeblaze_smem);
}

// Tile `tile` of a grouped GEMM whose M dimension is an expert's slots (a run-time count;
// the per-expert tile counts come from tile_prefix, built on the device by the index build):
// tiles are numbered expert by expert, N-tile outer and M-tile inner inside an expert so
// that consecutive blocks reuse one weight tile while the expert's gathered rows stay in L2.
struct SlotTile {
  int expert, slot0, rows, n0, n_tile;
  bool valid;
};

// n_tiles N tiles from n_tile_lo on (a column chunk; slot_tile: all of them).
template <int BM, int BN, int E>
MB_DEV SlotTile slot_tile_cols(int tile, const int* tile_prefix_all, const int* expert_token_offsets, int n_tiles,
                               int n_tile_lo) {
  const int N_TILES = n_tiles;
  const int* tp = tile_prefix_all + tile_prefix_row(BM) * (E + 1);
  SlotTile t{};
  const int m_global = tile / N_TILES;
  if (m_global >= tp[E]) { t.valid = false; return t; }
  int lo = 0, hi = E;  // invariant: tp[lo] <= m_global < tp[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (tp[mid] <= m_global) lo = mid; else hi = mid;
  }
  const int m_tiles = tp[lo + 1] - tp[lo];
  const int local = tile - tp[lo] * N_TILES;
  const int mt = local % m_tiles;
  t.n_tile = n_tile_lo + local / m_tiles;
  t.expert = lo;
  t.slot0 = expert_token_offsets[lo] + mt * BM;
  const int end = expert_token_offsets[lo + 1];
  t.rows = end - t.slot0 < BM ? end - t.slot0 : BM;
  t.n0 = t.n_tile * BN;
  t.valid = true;
  return t;
}
template <int BM, int BN, int E, int N_OUT>
MB_DEV SlotTile slot_tile(int tile, const int* tile_prefix_all, const int* expert_token_offsets) {
  return slot_tile_cols<BM, BN, E>(tile, tile_prefix_all, expert_token_offsets, (N_OUT + BN - 1) / BN, 0);
}

// The same numbering restricted to the slots [lo, hi) of a chunk (the forward runs the up
// and down projections chunk by chunk when h is wide, so h is held for one chunk at a time):
// per expert, its BM-aligned M tiles that meet the chunk, clipped to it, N-tile outer. The
// experts' tile counts are summed here (a loop over E: chunked layers have few experts), so
// the grid needs no host sync: at most (ceil((hi-lo)/BM) + 2E) * N_TILES tiles.
template <int BM, int BN, int E, int N_OUT>
MB_DEV SlotTile chunk_slot_tile(int tile, const int* expert_token_offsets, int lo, int hi) {
  constexpr int N_TILES = (N_OUT + BN - 1) / BN;
  SlotTile t{};
  t.valid = false;
  int before = 0;  // tiles of the chunk's earlier experts
  for (int e = 0; e < E; ++e) {
    const int off = expert_token_offsets[e], end = expert_token_offsets[e + 1];
    const int s0 = off > lo ? off : lo, s1 = end < hi ? end : hi;
    if (s1 <= s0) continue;
    const int mt_lo = (s0 - off) / BM, mt_hi = (s1 - off + BM - 1) / BM, m_tiles = mt_hi - mt_lo;
    if (tile < before + m_tiles * N_TILES) {
      const int local = tile - before;
      const int mt = mt_lo + local % m_tiles;
      t.n_tile = local / m_tiles;
      t.expert = e;
      const int first = off + mt * BM, last = first + BM < s1 ? first + BM : s1;
      t.slot0 = first > s0 ? first : s0;
      t.rows = last - t.slot0;
      t.n0 = t.n_tile * BN;
      t.valid = true;
      return t;
    }
    before += m_tiles * N_TILES;
  }
  return t;
}

}  // namespace moeblaze::gemm
