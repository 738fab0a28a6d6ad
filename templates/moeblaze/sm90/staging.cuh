// The epilogues' shared-memory staging tiles and their TMA traffic. A staging tile [ROWS][COLS]
// (bf16) is COLS / BOX boxes of [ROWS][BOX], one after the other: BOX = 64 in the 128-byte
// swizzle (a TMA box with SWIZZLE_128B), or BOX = 32 in the 64-byte swizzle (SWIZZLE_64B) for
// tiles of an odd number of 32-column blocks (gate_up's 96-column h; the host encodes those
// maps with 32-column boxes, runtime/tma.cpp). stmatrix / ldmatrix of the accumulator layout
// write and read either without bank conflicts. Rows go through ragged tensor maps
// (runtime/tma.hpp RaggedMapParams): a box at row coordinate (kRaggedBase - rows, row0 + rows)
// covers rows [row0, row0 + rows) of the tensor and no more, so a tile ending inside an expert's
// rows is clipped by the TMA unit (stores write nothing past it, loads read zeros).
#pragma once
#include "moeblaze/sm90/config.cuh"

namespace moeblaze::sm90 {

constexpr int kRaggedBase = 1 << 30;

template <int ROWS, int COLS, int BOX = 64>
using StagingLayout = decltype(cute::tile_to_shape(
    cute::conditional_t<BOX == 64, cute::GMMA::Layout_K_SW128_Atom<Element>, cute::GMMA::Layout_K_SW64_Atom<Element>>{},
    cute::make_shape(cute::Int<ROWS>{}, cute::Int<COLS>{})));

// The widest box that tiles COLS columns: 64, else 32.
template <int COLS>
constexpr int staging_box() {
  return COLS % 64 == 0 ? 64 : 32;
}

template <int ROWS, int COLS, int BOX = 64>
struct StagingTile {
  static_assert(BOX == 64 || BOX == 32, "staging boxes are 64 (128-byte swizzle) or 32 (64-byte swizzle) columns");
  static_assert(COLS % BOX == 0, "staging tiles are whole boxes");
  static constexpr int BOXES = COLS / BOX;
  static constexpr int BYTES = ROWS * COLS * 2;
  cute::array_aligned<Element, ROWS * COLS, 1024> data;

  // The thread's part of a tile in Mma's accumulator layout (a bf16 fragment) in or out.
  template <class Mma, class Frag>
  MB_DEV void write(const Frag& frag, int thread_idx) {
    using namespace cute;
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, Mma{});
    auto thr = r2s.get_slice(thread_idx);
    Tensor s = make_tensor(make_smem_ptr(data.data()), StagingLayout<ROWS, COLS, BOX>{});
    copy(r2s, thr.retile_S(frag), thr.partition_D(s));
  }
  template <class Mma, class Frag>
  MB_DEV void read(Frag& frag, int thread_idx) const {
    using namespace cute;
    auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, Mma{});
    auto thr = s2r.get_slice(thread_idx);
    Tensor s = make_tensor(make_smem_ptr(data.data()), StagingLayout<ROWS, COLS, BOX>{});
    copy(s2r, thr.partition_S(s), thr.retile_D(frag));
  }

  // One thread: the tile's boxes to columns [col0, +COLS) of rows [row0, row0 + rows) of a
  // ragged map (COUNT boxes from box0: a part of the tile).
  template <int COUNT = BOXES>
  MB_DEV void store(const void* map, int col0, int row0, int rows, int box0 = 0) const {
    CUTE_UNROLL
    for (int b = 0; b < COUNT; ++b)
      cute::SM90_TMA_STORE_3D::copy(map, data.data() + (box0 + b) * (ROWS * BOX), col0 + b * BOX, kRaggedBase - rows, row0 + rows);
  }
  static constexpr int BOX_BYTES = ROWS * BOX * 2;
  // The tile's boxes that start inside a map of `cols` columns. A ragged-map load of a box that
  // starts past the map's last column faulted on an H100 (compute-sanitizer: illegal address at
  // the TMA load; a 128-wide down_dgrad tile over n = 2880, whose second box starts at 2880),
  // where boxes that start inside and reach past are zero-filled as documented; stores of such
  // boxes are fine. So loads issue the live boxes only.
  static MB_DEV int live_boxes(int col0, int cols) {
    const int left = cols - col0;
    return left >= COLS ? BOXES : (left + BOX - 1) / BOX;
  }
  // One thread: the first `boxes` boxes of the same rows and columns loaded into the tile,
  // completing on `bar` (boxes x BOX_BYTES, out-of-range rows and columns zero-filled and
  // counted); the other boxes' shared memory is left as it was.
  MB_DEV void load(const void* map, uint64_t* bar, int col0, int row0, int rows, int boxes = BOXES) {
    CUTE_UNROLL
    for (int b = 0; b < BOXES; ++b)
      if (b < boxes)
        cute::SM90_TMA_LOAD_3D::copy(map, bar, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST),
                                     data.data() + b * (ROWS * BOX), col0 + b * BOX, kRaggedBase - rows, row0 + rows);
  }
  // One thread: the same boxes brought into L2 ahead of a load.
  static MB_DEV void prefetch(const void* map, int col0, int row0, int rows) {
    CUTE_UNROLL
    for (int b = 0; b < BOXES; ++b)
      cute::SM90_TMA_LOAD_3D::PREFETCH::copy(map, col0 + b * BOX, kRaggedBase - rows, row0 + rows);
  }
};

// 4- and 8-byte shared-memory accesses at a shared-window address. Addresses taken from a
// swizzled CuTe tensor are generic pointers to the compiler, which then emits generic LD / ST
// (a window check each); the epilogues' per-element accesses go through these instead.
MB_DEV uint32_t lds_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
MB_DEV void sts_b32(uint32_t addr, uint32_t v) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v)); }
MB_DEV void sts_v2_f32(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b));
}

// Two bf16 values in one 32-bit word (the lower address in the low half), as float pairs.
MB_DEV float2 unpack_bf16x2(uint32_t v) { return float2{__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u)}; }
MB_DEV uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}
// Bytes from a staging tile's base to an element of it (an address from its swizzled tensor).
MB_HD inline long long staging_offset(const void* p, const void* base) {
  return static_cast<const char*>(p) - static_cast<const char*>(base);
}

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
