// The tile schedules of the expert GEMMs: which output tile a block (or a persistent block's
// i-th tile) computes. Host and device code (tests/cpu/test_tile_schedule.cpp checks on the
// host that every schedule visits each tile exactly once, in both orders).
//
// ALT_ORDER (TileConfig::alt_order, tile suffix "_altorder": the tuner's schedule-order
// parameter) flips which tile index runs fastest inside an expert; the default order is the one
// that measured best on the suite shapes.
#pragma once
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::gemm {

// Tile `tile` of a grouped GEMM whose M dimension is an expert's slots (a run-time count;
// the per-expert tile counts come from tile_prefix, built on the device by the index build):
// tiles are numbered expert by expert. Default order: N-tile outer and M-tile inner inside an
// expert, so that consecutive blocks reuse one weight tile while the expert's gathered rows
// stay in L2; ALT_ORDER: M-tile outer, so consecutive blocks reuse one block of gathered rows.
struct SlotTile {
  int expert, slot0, rows, n0, n_tile;
  bool valid;
};

// n_tiles N tiles from n_tile_lo on (a column chunk; slot_tile: all of them).
template <int BM, int BN, int E, bool ALT_ORDER = false>
MB_HD SlotTile slot_tile_cols(int tile, const int* tile_prefix_all, const int* expert_token_offsets, int n_tiles,
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
  const int mt = ALT_ORDER ? local / N_TILES : local % m_tiles;
  t.n_tile = n_tile_lo + (ALT_ORDER ? local % N_TILES : local / m_tiles);
  t.expert = lo;
  t.slot0 = expert_token_offsets[lo] + mt * BM;
  const int end = expert_token_offsets[lo + 1];
  t.rows = end - t.slot0 < BM ? end - t.slot0 : BM;
  t.n0 = t.n_tile * BN;
  t.valid = true;
  return t;
}
template <int BM, int BN, int E, int N_OUT, bool ALT_ORDER = false>
MB_HD SlotTile slot_tile(int tile, const int* tile_prefix_all, const int* expert_token_offsets) {
  return slot_tile_cols<BM, BN, E, ALT_ORDER>(tile, tile_prefix_all, expert_token_offsets, (N_OUT + BN - 1) / BN, 0);
}

// The same numbering restricted to the slots [lo, hi) of a chunk (the forward runs the up
// and down projections chunk by chunk when h is wide, so h is held for one chunk at a time):
// per expert, its BM-aligned M tiles that meet the chunk, clipped to it. The experts' tile
// counts are summed here (a loop over E: chunked layers have few experts), so the grid needs
// no host sync: at most (ceil((hi-lo)/BM) + 2E) * N_TILES tiles.
template <int BM, int BN, int E, int N_OUT, bool ALT_ORDER = false>
MB_HD SlotTile chunk_slot_tile(int tile, const int* expert_token_offsets, int lo, int hi) {
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
      const int mt = mt_lo + (ALT_ORDER ? local / N_TILES : local % m_tiles);
      t.n_tile = ALT_ORDER ? local % N_TILES : local / m_tiles;
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

// Tile `tile` of a per-expert weight gradient (M x N_OUT per expert, reduction over the
// expert's slots); E * TM * TN of them, expert-major. Inside an expert the side with fewer
// tiles runs fastest by default: the blocks in flight then read all of that (smaller) operand
// and a few blocks of the other, k step by k step together, so L2 serves the repeats. With the
// larger side fastest, every wave streams the whole larger operand from DRAM: mixtral's dW2
// (dy 32 MiB, hg 112 MiB per expert) ran at 3.1 TB/s DRAM, 42% L2 hits under ncu.
// ALT_ORDER runs the other side fastest.
struct WgradTile {
  int expert, m0, n0, slot0, count;
  bool valid;
};
template <int BM, int BN, int E, int M, int N_OUT, bool ALT_ORDER = false>
MB_HD WgradTile wgrad_tile(int tile, const RoutingView& rv, int n_out = N_OUT) {
  constexpr int TM = (M + BM - 1) / BM;
  const int TN = (n_out + BN - 1) / BN;
  WgradTile w{};
  w.valid = tile < E * TM * TN;
  if (!w.valid) return w;
  w.expert = tile / (TM * TN);
  const int rem = tile % (TM * TN);
  const bool M_FASTEST = (TM <= TN) != ALT_ORDER;
  w.m0 = (M_FASTEST ? rem % TM : rem / TN) * BM;
  w.n0 = (M_FASTEST ? rem / TM : rem % TN) * BN;
  w.slot0 = rv.expert_token_offsets[w.expert];
  w.count = rv.expert_token_offsets[w.expert + 1] - w.slot0;
  return w;
}

}  // namespace moeblaze::gemm
