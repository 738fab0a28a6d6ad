// The store epilogue: a tile's accumulators, through an element op, to bf16 in a shared-memory
// staging tile (stmatrix, CuTe's tiled copy of the accumulator layout), then out by TMA stores
// of [BM][64] boxes. Rows are addressed through a ragged tensor map (runtime/tma.cpp
// encode_ragged_rows_map), so a tile that ends inside a group of rows (an expert's last slot
// tile) is clipped there by the TMA unit: no register-store fallback, no write into the next
// expert's rows.
#pragma once
#include "moeblaze/sm90/config.cuh"

namespace moeblaze::sm90 {

// The ragged map's row coordinate: rows [row0, row0 + rows) are written by a box at
// (kRaggedBase - rows, row0 + rows); box rows at or past kRaggedBase fall outside the map.
constexpr int kRaggedBase = 1 << 30;

// Where one output tile goes: columns [col0, +BN) of rows [row0, row0 + rows) of a ragged map.
struct RaggedTile {
  const void* map;
  int col0, row0, rows;
};

// The plain element op: the accumulator itself.
struct Identity {
  MB_DEV float operator()(float v) const { return v; }
};

template <class Cfg>
struct TmaStoreEpilogue {
  using TiledMma = typename Cfg::TiledMma;

  struct Storage {
    cute::array_aligned<Element, cute::cosize_v<typename Cfg::SmemLayoutD>, 1024> d;
  };

  // thread_idx: the thread's index among the tile's TILE_THREADS; barrier_id: a named barrier
  // of those threads. Returns once the TMA unit has read the staging tile (it may be rewritten).
  template <class Acc, class ElementOp = Identity>
  static MB_DEV void store(Storage& s, const Acc& acc, int thread_idx, int barrier_id, const RaggedTile& out,
                           ElementOp op = {}) {
    using namespace cute;
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, TiledMma{});
    auto thr = r2s.get_slice(thread_idx);
    Tensor sD = make_tensor(make_smem_ptr(s.d.data()), typename Cfg::SmemLayoutD{});  // (BM, BN)
    Tensor tRS_sD = thr.partition_D(sD);
    Tensor rD = make_tensor<Element>(acc.layout());
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) rD(i) = Element(op(acc(i)));
    // The staging tile is free: every thread of the tile got past the previous store's wait
    // (thread 0 waits for the TMA unit's reads before it arrives here again).
    cutlass::arch::NamedBarrier::sync(Cfg::TILE_THREADS, barrier_id);
    copy(r2s, thr.retile_S(rD), tRS_sD);
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes before the TMA unit reads
    cutlass::arch::NamedBarrier::sync(Cfg::TILE_THREADS, barrier_id);
    if (thread_idx == 0 && out.rows > 0) {  // a cluster pair's empty half stores nothing
      CUTE_UNROLL
      for (int b = 0; b < Cfg::BN / 64; ++b)
        SM90_TMA_STORE_3D::copy(out.map, s.d.data() + b * (Cfg::BM * 64), out.col0 + b * 64, kRaggedBase - out.rows,
                                out.row0 + out.rows);
      tma_store_arrive();
      tma_store_wait<0>();
    }
  }

  // Before the block exits: the last stores have left shared memory.
  static MB_DEV void drain(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace moeblaze::sm90
