// gate_up's epilogue: the accumulator's left half holds A = x W1_e^T and its right half
// B = x W3_e^T for the same n columns (TmaRowsK2 stacks the two weights' rows in B; each thread
// holds both halves of its columns). Rounded to bf16, [A|B] is saved as H (when the checkpoint
// mode keeps it) and h = act(A) * up(B) (act(A) for plain activations) is computed from the
// rounded values, so that the backward's h recomputed from H is bitwise the same. Both leave by
// TMA stores through ragged maps: H's two parts through a map each (columns clipped at n), h
// through its own.
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/sm90/staging.cuh"

namespace moeblaze::sm90 {

template <class Cfg, Activation ACT>
struct GateUpEpilogue {
  static constexpr int G = gate_parts<ACT>();
  static constexpr int NH = Cfg::BN / G;  // h columns a tile writes
  static_assert(NH % 64 == 0, "h leaves in 64-column boxes");
  using HMma = typename Cfg::template TiledMmaN<NH>;

  struct Params {
    const void* H_parts[2];  // ragged maps of H's A and B columns (nullptr: H not saved)
    const void* h;           // ragged map of h (nullptr: not needed)
    int col0, row0, h_row0, rows;
  };
  struct Storage {
    StagingTile<Cfg::BM, Cfg::BN> H;
    StagingTile<Cfg::BM, NH> h;
  };
  static constexpr int STAGING_BYTES = StagingTile<Cfg::BM, Cfg::BN>::BYTES + StagingTile<Cfg::BM, NH>::BYTES;

  static MB_DEV void init(Storage&) {}

  template <class Acc>
  static MB_DEV void store(Storage& s, const Acc& acc, int thread_idx, int barrier_id, const Params& p, int) {
    using namespace cute;
    auto rH = bf16_fragment(acc);
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) rH(i) = Element(acc(i));
    tile_sync<Cfg>(barrier_id);  // the staging tiles are free (see TmaStoreEpilogue)
    // H first: the accumulators are dead from here, and the activation's temporaries have their
    // registers (computed beside them, the activation spilled).
    if (p.H_parts[0]) s.H.template write<typename Cfg::TiledMma>(rH, thread_idx);
    if constexpr (G == 1) {
      if (p.h) {  // h = act(A) over the written H's registers (both tiles BM x BN)
        CUTE_UNROLL
        for (int i = 0; i < size(rH); ++i) rH(i) = Element(act_fwd<ACT>(static_cast<float>(rH(i))));
        s.h.template write<HMma>(rH, thread_idx);
      }
    } else if (p.h) {
      // h from the rounded [A|B]: the value at (v, j) of the left half pairs with (v, j + NH / 8)
      // of the right half (fragment modes ((2 columns, 2 row halves, BN / 8 blocks), M tiles, 1)).
      auto rh = bf16_fragment(partition_fragment_C(HMma{}, Shape<Int<Cfg::BM>, Int<NH>>{}));
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
      s.h.template write<HMma>(rh, thread_idx);
    }
    cutlass::arch::fence_view_async_shared();
    tile_sync<Cfg>(barrier_id);
    if (thread_idx == 0 && p.rows > 0) {
      if (p.H_parts[0]) {
        s.H.template store<NH / 64>(p.H_parts[0], p.col0, p.row0, p.rows);
        if constexpr (G == 2) s.H.template store<NH / 64>(p.H_parts[1], p.col0, p.row0, p.rows, NH / 64);
      }
      if (p.h) s.h.store(p.h, p.col0, p.h_row0, p.rows);
      cute::tma_store_arrive();
      cute::tma_store_wait<0>();
    }
  }

  static MB_DEV void drain(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace moeblaze::sm90
