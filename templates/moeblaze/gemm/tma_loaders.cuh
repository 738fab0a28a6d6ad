// TMA (the Tensor Memory Accelerator, sm_90) loads of the operands that are not gathered:
// one thread of the producer warpgroup issues a whole stage tile with cp.async.bulk.tensor,
// which lands in the 128-byte-swizzled layout the wgmma descriptors read (the host encodes
// the tensor map with CU_TENSOR_MAP_SWIZZLE_128B and a box of [rows][64 k] = 128-byte rows,
// the K-major atom of gemm/mainloop/wgmma_multistage.cuh) and completes its bytes on the
// stage's mbarrier. The producer's other 127 threads, and its registers and issue slots, stay
// with the gathered operand's cp.async copies.
#pragma once
#include "moeblaze/gemm/loaders.cuh"
#include "moeblaze/ptx/cluster.cuh"
#include "moeblaze/ptx/tma.cuh"

namespace moeblaze::gemm {

// An MN-major stage [ROWS k][COLS] from one map: COLS/64 boxes of [ROWS][64] (one block of
// the blocked layout each) at (col0 + 64j, row).
template <int ROWS, int COLS>
MB_DEV void tma_load_mn_stage(bf16_t* smem, const TmaMap* map, int col0, int row, mbar_t* bar) {
#pragma unroll
  for (int j = 0; j < COLS / 64; ++j) tma_load_2d(smem + j * ROWS * 64, map, col0 + 64 * j, row, bar);
}

// A K-major operand read by TMA: PARTS tensor maps (W1 and W3 stacked: 2), each giving a
// [rows][64] box at row `row` of the map's [E*rows_per_expert, k] view.
template <int PARTS>
struct TmaRows {
  const TmaMap* map[PARTS];
  int row;
};

// An MN-major operand read by TMA whose k rows are contiguous (dH and hg: an expert's slots
// in order): stage tile [64 k][COLS], COLS/64 boxes of [64][64] (the blocked swizzled layout,
// one 8 KiB block each) at (col0 + 64j, row0 + k0) of the map's [rows, cols] view. Only rows
// [0, count) exist (the next expert's follow): a stage that would read past them goes through
// `rows` (the cp.async path, which zero-fills the missing rows) instead.
template <class Fallback>
struct TmaMnRows {
  const TmaMap* map;
  int col0, row0, count;
  Fallback rows;
};

// An MN-major weight read by TMA: k rows of an expert's matrix, PARTS matrices stacked along
// k (up dgrad: W1 for k < split, then W3), each viewed as [E*rows_per_expert, cols]; stage
// tile [64 k][COLS] as COLS/64 boxes of [64][64] at (col0 + 64j, row_base + k0 - part*split).
// A stage never straddles the split or the expert's last row (the tile is legal only when the
// split and the row count are multiples of 64), so no stage needs a fallback.
template <int PARTS>
struct TmaMnWeights {
  const TmaMap* map[PARTS];
  int row_base, split, col0;
};

// The producer-side loader of a TMA operand, the StageLoader interface plus the barrier:
// thread 0 of the producer announces the stage's bytes on `bar` and issues the boxes.
template <int ROWS_PER_PART, int PARTS, int CLUSTER = 1>
struct TmaStageLoader {
  static constexpr unsigned BYTES = PARTS * ROWS_PER_PART * 64 * 2;
  static_assert(CLUSTER == 1 || (CLUSTER == 2 && (PARTS == 2 || ROWS_PER_PART % 16 == 0)),
                "a pair of blocks shares a stage by parts (W1 | W3) or by row halves");
  const TmaRows<PARTS>& src;
  bool issuer;
  unsigned rank;  // the block's rank in its cluster
  MB_DEV TmaStageLoader(const TmaRows<PARTS>& s, int ptid) : src(s), issuer(ptid == 0), rank(0) {
    if constexpr (CLUSTER > 1) rank = cluster_ctarank();
    if (issuer) tma_prefetch_maps(s.map);
  }
  MB_DEV void fetch(int) {}
  // In a cluster of two, the whole stage lands in both blocks (each block's barrier expects all
  // of its bytes) and each block issues half of it, multicast: its part (W1 or W3), or its half
  // of the rows (the host encodes the map with a box of ROWS_PER_PART / 2 rows).
  MB_DEV void load(bf16_t* smem, int k0, mbar_t* bar) const {
    if (!issuer) return;
    mbar_expect_tx(bar, BYTES);
    if constexpr (CLUSTER == 1) {
#pragma unroll
      for (int p = 0; p < PARTS; ++p) tma_load_2d(smem + p * ROWS_PER_PART * 64, src.map[p], k0, src.row, bar);
    } else if constexpr (PARTS == 2) {
      tma_load_2d_multicast(smem + rank * ROWS_PER_PART * 64, rank ? src.map[1] : src.map[0], k0, src.row, bar, 0x3);
    } else {
      constexpr int HALF = ROWS_PER_PART / 2;
      tma_load_2d_multicast(smem + rank * HALF * 64, src.map[0], k0, src.row + rank * HALF, bar, 0x3);
    }
  }
};

// Loader of a TmaMnRows operand: whole stages by TMA, the partial last stage of an expert by
// the producer's cp.async copies (landed[s] covers those, full[s] the TMA bytes).
template <int ROWS, int COLS, int THREADS, class F>
struct TmaMnStageLoader {
  static_assert(COLS % 64 == 0, "MN-major TMA boxes are 64 columns wide");
  static constexpr unsigned BYTES = ROWS * COLS * 2;
  const TmaMnRows<F>& src;
  StageLoader<ROWS, COLS, THREADS, false, F> tail;
  bool issuer;
  MB_DEV TmaMnStageLoader(const TmaMnRows<F>& s, int ptid) : src(s), tail(s.rows, ptid), issuer(ptid == 0) {
    if (issuer) tma_prefetch_map(s.map);
  }
  MB_DEV void fetch(int) {}
  MB_DEV void load(bf16_t* smem, int k0, mbar_t* bar) {
    if (k0 + ROWS <= src.count) {
      if (!issuer) return;
      mbar_expect_tx(bar, BYTES);
      tma_load_mn_stage<ROWS, COLS>(smem, src.map, src.col0, src.row0 + k0, bar);
    } else {
      tail.fetch(k0);
      tail.load(smem, k0);
    }
  }
};

template <int ROWS, int COLS, int PARTS, int CLUSTER = 1>
struct TmaMnWeightLoader {
  static_assert(COLS % 64 == 0 && ROWS == 64, "MN-major TMA stages are [64 k][64-column blocks]");
  static_assert(CLUSTER == 1 || (CLUSTER == 2 && COLS % 128 == 0), "a pair of blocks shares the 64-column boxes");
  static constexpr unsigned BYTES = ROWS * COLS * 2;
  const TmaMnWeights<PARTS>& src;
  bool issuer;
  unsigned rank;
  MB_DEV TmaMnWeightLoader(const TmaMnWeights<PARTS>& s, int ptid) : src(s), issuer(ptid == 0), rank(0) {
    if constexpr (CLUSTER > 1) rank = cluster_ctarank();
    if (issuer) tma_prefetch_maps(s.map);
  }
  MB_DEV void fetch(int) {}
  // In a cluster of two, each block issues every other 64-column box, multicast to both.
  MB_DEV void load(bf16_t* smem, int k0, mbar_t* bar) const {
    if (!issuer) return;
    const bool second = PARTS > 1 && k0 >= src.split;
    const int row = src.row_base + k0 - (second ? src.split : 0);
    const TmaMap* map = second ? src.map[PARTS - 1] : src.map[0];  // no dynamic index: no stack
    mbar_expect_tx(bar, BYTES);
    if constexpr (CLUSTER == 1) {
      tma_load_mn_stage<ROWS, COLS>(smem, map, src.col0, row, bar);
    } else {
#pragma unroll
      for (int j = 0; j < COLS / 64; j += 2) {
        const int box = j + static_cast<int>(rank);
        tma_load_2d_multicast(smem + box * ROWS * 64, map, src.col0 + 64 * box, row, bar, 0x3);
      }
    }
  }
};

// The loader of one operand of a warp-specialised stage: TMA for TmaRows (K-major) and
// TmaMnRows (MN-major) sources, the cp.async StageLoader otherwise.
// CLUSTER: blocks of a cluster that share this operand's stages (TMA multicast; B operands).
// PREFIX_ROWS: the cp.async loader's K-major rows exist as a prefix (TileLoader), for the gathered A.
template <int ROWS, int COLS, int THREADS, bool KMAJOR, class Src, int CLUSTER = 1, bool PREFIX_ROWS = false>
struct LoaderFor {
  static_assert(CLUSTER == 1, "only TMA operands are shared by a cluster");
  using type = StageLoader<ROWS, COLS, THREADS, KMAJOR, Src, PREFIX_ROWS>;
  static constexpr bool kTma = false;
};
template <int ROWS, int COLS, int THREADS, int P, int CLUSTER, bool R>
struct LoaderFor<ROWS, COLS, THREADS, true, TmaRows<P>, CLUSTER, R> {
  using type = TmaStageLoader<ROWS / P, P, CLUSTER>;
  static constexpr bool kTma = true;
};
template <int ROWS, int COLS, int THREADS, class F, int CLUSTER, bool R>
struct LoaderFor<ROWS, COLS, THREADS, false, TmaMnRows<F>, CLUSTER, R> {
  static_assert(CLUSTER == 1, "an expert's contiguous rows are not shared by a cluster");
  using type = TmaMnStageLoader<ROWS, COLS, THREADS, F>;
  static constexpr bool kTma = true;
};

template <int ROWS, int COLS, int THREADS, int P, int CLUSTER, bool R>
struct LoaderFor<ROWS, COLS, THREADS, false, TmaMnWeights<P>, CLUSTER, R> {
  using type = TmaMnWeightLoader<ROWS, COLS, P, CLUSTER>;
  static constexpr bool kTma = true;
};

template <bool TMA, class Loader>
MB_DEV void load_operand(Loader& l, bf16_t* smem, unsigned smem_at, int k0, mbar_t* full) {
  if constexpr (TMA) l.load(smem, k0, full);
  else l.load(smem_at, k0);
}

}  // namespace moeblaze::gemm
