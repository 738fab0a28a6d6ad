// The store epilogue: a tile's accumulators, through an element op, to bf16 in a staging tile,
// then out by TMA stores through a ragged map (staging.cuh), so a tile that ends inside a group
// of rows (an expert's last slot tile) is clipped there: no register-store fallback, no write
// into the next expert's rows.
//
// An epilogue of the layer has: Storage (its shared memory; STAGING_BYTES of staging, which the
// host reserves), Params (what it needs besides the accumulators, made per tile by the problem),
// init(storage) (one thread, before the block's first barrier), store(storage, acc, thread_idx,
// barrier_id, params, iteration) (the tile's consumers; `iteration` counts the calls of this
// consumer group) and drain(thread_idx) (before the block exits).
#pragma once
#include "moeblaze/sm90/staging.cuh"

namespace moeblaze::sm90 {

// Where one output tile goes: columns [col0, +BN) of rows [row0, row0 + rows) of a ragged map.
struct RaggedTile {
  const void* map;
  int col0, row0, rows;
};

// The plain element op: the accumulator itself.
struct Identity {
  MB_DEV float operator()(float v) const { return v; }
};

template <class Cfg, class ElementOp = Identity>
struct TmaStoreEpilogue {
  using Params = RaggedTile;
  struct Storage {
    StagingTile<Cfg::BM, Cfg::BN> d;
  };
  static constexpr int STAGING_BYTES = StagingTile<Cfg::BM, Cfg::BN>::BYTES;

  static MB_DEV void init(Storage&) {}

  // Returns once the TMA unit has read the staging tile (it may be rewritten). Deferring that
  // wait to the next tile's epilogue (CUTLASS's order, the reads under the next mainloop) made
  // the cooperative 128x256 tiles slower on an H100 (bench/ab.py: down_proj 5.423 -> 7.236 ms on
  // mixtral-8x7b, 6.256 -> 7.511 on deepseek-v3; gate_up_dgrad 11.906 -> 14.368 on deepseek-v3).
  template <class Acc>
  static MB_DEV void store(Storage& s, const Acc& acc, int thread_idx, int barrier_id, const Params& out, int) {
    auto rD = bf16_fragment(acc);
    const ElementOp op{};
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc); ++i) rD(i) = Element(op(acc(i)));
    // The staging tile is free: every thread of the tile got past the previous store's wait
    // (thread 0 waits for the TMA unit's reads before it arrives here again).
    tile_sync<Cfg>(barrier_id);
    s.d.template write<typename Cfg::TiledMma>(rD, thread_idx);
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes before the TMA unit reads
    tile_sync<Cfg>(barrier_id);
    if (thread_idx == 0 && out.rows > 0) {  // a cluster pair's empty half stores nothing
      s.d.store(out.map, out.col0, out.row0, out.rows);
      cute::tma_store_arrive();
      cute::tma_store_wait<0>();
    }
  }

  // Before the block exits: the last stores have left shared memory.
  static MB_DEV void drain(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace moeblaze::sm90
