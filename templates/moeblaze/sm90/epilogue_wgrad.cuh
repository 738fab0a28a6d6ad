// The weight gradients' epilogue: a tile of dW_e (rows [row0, +BM), columns [col0, +BN) of
// expert `expert`'s matrix) out by TMA through the output's 3-D map ([E][rows][cols],
// runtime/tma.hpp OutputMapParams: rows and columns past the matrix are clipped), as
// GradOutput asks: bf16 stores, bf16 reduce-adds into the gradient already there (accumulation
// over micro-batches), or fp32 reduce-adds into a main gradient. One tile owns its elements, so
// the adds need no ordering between tiles; a tile's sum over the expert's slots is the
// mainloop's, in slot order: deterministic.
#pragma once
#include "moeblaze/sm90/staging.cuh"

namespace moeblaze::sm90 {

template <class Cfg>
struct WgradEpilogue {
  // A tile may straddle two matrices stacked along its rows (gate_up_wgrad's dW1 | dW3 where n
  // is not a multiple of BM): it goes to both maps, each clipping the other's rows (map2's row
  // coordinate is then negative: the TMA unit writes no out-of-range row).
  struct Params {
    const void* map;   // bf16 or fp32 (GradOutput::add_f32) output map
    const void* map2;  // the second matrix's, or nullptr
    int expert, row0, row2, col0;
    int grad_output;
  };
  // bf16 [BM][BN] in 64-column boxes, or fp32 [BM][BN / 2] in 32-column boxes (128 bytes a row
  // each: the fp32 tile leaves in two halves through the same bytes).
  using F32Layout = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<float>{},
                                                 cute::make_shape(cute::Int<Cfg::BM>{}, cute::Int<Cfg::BN / 2>{})));
  struct Storage {
    StagingTile<Cfg::BM, Cfg::BN> d;
  };
  static constexpr int STAGING_BYTES = StagingTile<Cfg::BM, Cfg::BN>::BYTES;

  static MB_DEV void init(Storage&) {}

  template <class Acc>
  static MB_DEV void store(Storage& s, const Acc& acc, int thread_idx, int barrier_id, const Params& p, int) {
    using namespace cute;
    if (p.grad_output != static_cast<int>(GradOutput::add_f32)) {
      auto rD = bf16_fragment(acc);
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) rD(i) = Element(acc(i));
      tile_sync<Cfg>(barrier_id);  // the staging tile is free (see TmaStoreEpilogue)
      s.d.template write<typename Cfg::TiledMma>(rD, thread_idx);
      cutlass::arch::fence_view_async_shared();
      tile_sync<Cfg>(barrier_id);
      if (thread_idx == 0) {
        const bool add = p.grad_output == static_cast<int>(GradOutput::add_bf16);
        CUTE_UNROLL
        for (int part = 0; part < 2; ++part) {
          const void* map = part ? p.map2 : p.map;
          const int row = part ? p.row2 : p.row0;
          if (!map) continue;
          CUTE_UNROLL
          for (int b = 0; b < Cfg::BN / 64; ++b) {
            const Element* box = s.d.data.data() + b * (Cfg::BM * 64);
            if (add) SM90_TMA_REDUCE_ADD_3D::copy(map, box, p.col0 + b * 64, row, p.expert);
            else SM90_TMA_STORE_3D::copy(map, box, p.col0 + b * 64, row, p.expert);
          }
        }
        tma_store_arrive();
        tma_store_wait<0>();
      }
      return;
    }
    // fp32: each half of the columns through the staging bytes in turn. Column blocks of 8 (the
    // fragment's j) fall in a half by their index alone, so each half's loop is unrolled code.
    Tensor sF = make_tensor(make_smem_ptr(reinterpret_cast<float*>(s.d.data.data())), F32Layout{});
    const auto c = typename Cfg::TiledMma{}.get_slice(thread_idx).partition_C(
        make_identity_tensor(Shape<Int<Cfg::BM>, Int<Cfg::BN>>{}));
    CUTE_UNROLL
    for (int half = 0; half < 2; ++half) {
      tile_sync<Cfg>(barrier_id);  // the staging bytes are free
      CUTE_UNROLL
      for (int m = 0; m < size<1>(acc); ++m)
        CUTE_UNROLL
        for (int j = half * (Cfg::BN / 16); j < (half + 1) * (Cfg::BN / 16); ++j)
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            const auto at0 = make_coord(make_coord(0, h, j), m, 0), at1 = make_coord(make_coord(1, h, j), m, 0);
            const int r = get<0>(c(at0)), col = get<1>(c(at0)) - half * (Cfg::BN / 2);
            *reinterpret_cast<float2*>(&sF(r, col)) = float2{acc(at0), acc(at1)};
          }
      cutlass::arch::fence_view_async_shared();
      tile_sync<Cfg>(barrier_id);
      if (thread_idx == 0) {
        for (int part = 0; part < 2; ++part) {
          const void* map = part ? p.map2 : p.map;
          if (!map) continue;
          CUTE_UNROLL
          for (int b = 0; b < Cfg::BN / 64; ++b)
            SM90_TMA_REDUCE_ADD_3D::copy(map, reinterpret_cast<const float*>(s.d.data.data()) + b * (Cfg::BM * 32),
                                         p.col0 + half * (Cfg::BN / 2) + b * 32, part ? p.row2 : p.row0, p.expert);
        }
        tma_store_arrive();
        tma_store_wait<0>();
      }
    }
  }

  static MB_DEV void drain(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace moeblaze::sm90
