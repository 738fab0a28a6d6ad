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

  // Cooperative tiles: thread 0 (always the same thread, which issued the previous tile's
  // stores) waits for the TMA unit to have read the staging tile when it needs it again, so the
  // reads run under the next tile's mainloop. Ping-pong groups hand the staging tile to each
  // other, and a thread can wait only for its own stores: there store() returns once they have
  // read it.
  template <class Acc>
  static MB_DEV void store(Storage& s, const Acc& acc, int thread_idx, int barrier_id, const Params& out, int) {
    auto rD = bf16_fragment(acc);
    const ElementOp op{};
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc); ++i) rD(i) = Element(op(acc(i)));
    if constexpr (!Cfg::PINGPONG) {
      if (thread_idx == 0) cute::tma_store_wait<0>();
    }
    tile_sync<Cfg>(barrier_id);  // the staging tile is free
    s.d.template write<typename Cfg::TiledMma>(rD, thread_idx);
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes before the TMA unit reads
    tile_sync<Cfg>(barrier_id);
    if (thread_idx == 0 && out.rows > 0) {  // a cluster pair's empty half stores nothing
      s.d.store(out.map, out.col0, out.row0, out.rows);
      cute::tma_store_arrive();
      if constexpr (Cfg::PINGPONG) cute::tma_store_wait<0>();
    }
  }

  // Before the block exits: the last stores have left shared memory.
  static MB_DEV void drain(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace moeblaze::sm90
