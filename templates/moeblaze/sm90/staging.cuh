// The epilogues' shared-memory staging tiles and their TMA traffic. A staging tile [ROWS][COLS]
// (bf16) is COLS / 64 boxes of [ROWS][64], one after the other, each in the 128-byte swizzle:
// the layout of a TMA box with SWIZZLE_128B, and one stmatrix / ldmatrix of the accumulator
// layout writes or reads it without bank conflicts. Rows go through ragged tensor maps
// (runtime/tma.hpp RaggedMapParams): a box at row coordinate (kRaggedBase - rows, row0 + rows)
// covers rows [row0, row0 + rows) of the tensor and no more, so a tile ending inside an expert's
// rows is clipped by the TMA unit (stores write nothing past it, loads read zeros).
#pragma once
#include "moeblaze/sm90/config.cuh"

namespace moeblaze::sm90 {

constexpr int kRaggedBase = 1 << 30;

template <int ROWS, int COLS>
using StagingLayout = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                                   cute::make_shape(cute::Int<ROWS>{}, cute::Int<COLS>{})));

template <int ROWS, int COLS>
struct StagingTile {
  static_assert(COLS % 64 == 0, "staging tiles are whole 64-column boxes");
  static constexpr int BYTES = ROWS * COLS * 2;
  cute::array_aligned<Element, ROWS * COLS, 1024> data;

  // The thread's part of a tile in Mma's accumulator layout (a bf16 fragment) in or out.
  template <class Mma, class Frag>
  MB_DEV void write(const Frag& frag, int thread_idx) {
    using namespace cute;
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, Mma{});
    auto thr = r2s.get_slice(thread_idx);
    Tensor s = make_tensor(make_smem_ptr(data.data()), StagingLayout<ROWS, COLS>{});
    copy(r2s, thr.retile_S(frag), thr.partition_D(s));
  }
  template <class Mma, class Frag>
  MB_DEV void read(Frag& frag, int thread_idx) const {
    using namespace cute;
    auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, Mma{});
    auto thr = s2r.get_slice(thread_idx);
    Tensor s = make_tensor(make_smem_ptr(data.data()), StagingLayout<ROWS, COLS>{});
    copy(s2r, thr.partition_S(s), thr.retile_D(frag));
  }

  // One thread: the tile's boxes to columns [col0, +COLS) of rows [row0, row0 + rows) of a
  // ragged map (BOXES: the first ones only).
  template <int BOXES = COLS / 64>
  MB_DEV void store(const void* map, int col0, int row0, int rows, int box0 = 0) const {
    CUTE_UNROLL
    for (int b = 0; b < BOXES; ++b)
      cute::SM90_TMA_STORE_3D::copy(map, data.data() + (box0 + b) * (ROWS * 64), col0 + b * 64, kRaggedBase - rows, row0 + rows);
  }
  // One thread: the same rows and columns loaded into the tile, completing on `bar`
  // (BYTES, out-of-range rows and columns zero-filled and counted).
  MB_DEV void load(const void* map, uint64_t* bar, int col0, int row0, int rows) {
    CUTE_UNROLL
    for (int b = 0; b < COLS / 64; ++b)
      cute::SM90_TMA_LOAD_3D::copy(map, bar, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST),
                                   data.data() + b * (ROWS * 64), col0 + b * 64, kRaggedBase - rows, row0 + rows);
  }
  // One thread: the same boxes brought into L2 ahead of a load.
  static MB_DEV void prefetch(const void* map, int col0, int row0, int rows) {
    CUTE_UNROLL
    for (int b = 0; b < COLS / 64; ++b)
      cute::SM90_TMA_LOAD_3D::PREFETCH::copy(map, col0 + b * 64, kRaggedBase - rows, row0 + rows);
  }
};

// A bf16 fragment in the accumulator layout of acc.
template <class Acc>
MB_DEV auto bf16_fragment(const Acc& acc) {
  return cute::make_tensor<Element>(acc.layout());
}

// The named barrier of one tile's consumers (barrier_id: a ping-pong group's own).
template <class Cfg>
MB_DEV void tile_sync(int barrier_id) {
  cutlass::arch::NamedBarrier::sync(Cfg::TILE_THREADS, barrier_id);
}

}  // namespace moeblaze::sm90
