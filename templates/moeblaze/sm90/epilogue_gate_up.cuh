// gate_up's epilogue: the accumulator's left half holds A = x W1_e^T and its right half
// B = x W3_e^T for the same n columns (TmaRowsK2 stacks the two weights' rows in B; each thread
// holds both halves of its columns). Rounded to bf16, [A|B] is saved as H (when the checkpoint
// mode keeps it) and h = act(A) * up(B) (act(A) for plain activations) is computed from the
// rounded values, so that the backward's h recomputed from H is bitwise the same. Both leave by
// TMA stores through ragged maps: H's two parts through a map each (columns clipped at n), h
// through its own. H and h take turns in one staging tile (H's stores have read it before h is
// written): the shared memory it saves is a pipeline stage at 128 x (2 x 96).
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/sm90/staging.cuh"

namespace moeblaze::sm90 {

template <class Cfg, Activation ACT>
struct GateUpEpilogue {
  static constexpr int G = gate_parts<ACT>();
  static constexpr int NH = Cfg::BN / G;  // h columns a tile writes
  // 64-column boxes where NH allows (64, 128), else 32-column ones (96) for H's parts and h.
  static constexpr int BOX = staging_box<NH>();
  static_assert(NH % 32 == 0, "h leaves in 32- or 64-column boxes");
  using HMma = typename Cfg::template TiledMmaN<NH>;

  struct Params {
    const void* H_parts[2];  // ragged maps of H's A and B columns (nullptr: H not saved)
    const void* h;           // ragged map of h (nullptr: not needed)
    int col0, row0, h_row0, rows;
  };
  using HTile = StagingTile<Cfg::BM, Cfg::BN, BOX>;
  using hTile = StagingTile<Cfg::BM, NH, BOX>;  // H's first NH / BOX boxes: the same layout
  union Storage {
    HTile H;
    hTile h;
  };
  static constexpr int STAGING_BYTES = HTile::BYTES;

  static MB_DEV void init(Storage&) {}

  template <class Acc>
  static MB_DEV void store(Storage& s, const Acc& acc, int thread_idx, int barrier_id, const Params& p, int) {
    using namespace cute;
    auto rH = bf16_fragment(acc);
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) rH(i) = Element(acc(i));
    tile_sync<Cfg>(barrier_id);  // the staging tile is free (see TmaStoreEpilogue)
    const bool stores = thread_idx == 0 && p.rows > 0;
    // H first: the accumulators are dead from here, and the activation's temporaries have their
    // registers (computed beside them, the activation spilled).
    if (p.H_parts[0]) {
      s.H.template write<typename Cfg::TiledMma>(rH, thread_idx);
      cutlass::arch::fence_view_async_shared();
      tile_sync<Cfg>(barrier_id);
      if (stores) {
        s.H.template store<NH / BOX>(p.H_parts[0], p.col0, p.row0, p.rows);
        if constexpr (G == 2) s.H.template store<NH / BOX>(p.H_parts[1], p.col0, p.row0, p.rows, NH / BOX);
        cute::tma_store_arrive();
      }
    }
    if (!p.h) {
      if (stores) cute::tma_store_wait<0>();
      return;
    }
    // h from the rounded [A|B] (or act(A)), in registers while H's stores read the staging tile.
    auto rh = bf16_fragment(partition_fragment_C(HMma{}, cute::Shape<cute::Int<Cfg::BM>, cute::Int<NH>>{}));
    if constexpr (G == 1) {
      CUTE_UNROLL
      for (int i = 0; i < size(rH); ++i) rh(i) = Element(act_fwd<ACT>(static_cast<float>(rH(i))));
    } else {
      // The value at (v, j) of the left half pairs with (v, j + NH / 8) of the right half
      // (fragment modes ((2 columns, 2 row halves, BN / 8 blocks), M tiles, 1)).
      CUTE_UNROLL
      for (int m = 0; m < size<1>(acc); ++m)
        CUTE_UNROLL
        for (int j = 0; j < NH / 8; ++j)
          CUTE_UNROLL
          for (int v = 0; v < 4; ++v) {
            const auto at = make_coord(make_coord(v % 2, v / 2, j), m, 0);
            const float a = static_cast<float>(rH(at));
            const float b = static_cast<float>(rH(make_coord(make_coord(v % 2, v / 2, j + NH / 8), m, 0)));
            rh(at) = Element(act_fwd<ACT>(a) * act_up<ACT>(b));
          }
    }
    if (p.H_parts[0]) {
      if (stores) cute::tma_store_wait<0>();  // H's stores have read the staging tile
      tile_sync<Cfg>(barrier_id);
    }
    s.h.template write<HMma>(rh, thread_idx);
    cutlass::arch::fence_view_async_shared();
    tile_sync<Cfg>(barrier_id);
    if (stores) {
      s.h.store(p.h, p.col0, p.h_row0, p.rows);
      cute::tma_store_arrive();
      cute::tma_store_wait<0>();
    }
  }

  static MB_DEV void drain(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace moeblaze::sm90
