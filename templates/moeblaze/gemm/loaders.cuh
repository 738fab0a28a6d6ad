// The cp.async operand loaders of the mainloops: a [ROWS][COLS] stage tile from a row source
// (gemm/rows.cuh) into the swizzled shared-memory layout the MMA reads. TileLoader keeps its
// rows (K-major) or walks k rows (MN-major); MnMajorLoader reads a gathered MN-major stage's
// row keys one stage early; StageLoader picks between them per operand.
#pragma once
#include "moeblaze/gemm/tile.cuh"
#include "moeblaze/gemm/mn_map.cuh"

namespace moeblaze::gemm {

// Loads a [ROWS][COLS] tile into swizzled shared memory, 16 bytes per cp.async.
// KMAJOR: rows fixed (pointers cached once), the column window moves along k.
// !KMAJOR: rows are k and move, the column window is fixed.
// BLOCKED: columns stored in 64-wide blocks (swizzle_blocked; the wgmma MN-major layout);
// for 64-column tiles both layouts are the same.
// PREFIX_ROWS (K-major): the rows that exist are a prefix of each thread's rows (a tile's
// slots), so a thread keeps their count and a missing row's pointer is a real one (never read):
// every copy is its row pointer plus k under one predicate, its column inside k and i < count,
// with no address select (QuACK's gather, 4 instructions a copy). A missing row is zero-filled
// and read nothing. The warp-specialised producers' gathered slots take it. (Reading a real row
// for a missing one, which drops the count compare, put up to 127 readers of the tile's first
// row on one L2 line: deepseek-v3's gate_up 1.26x and down_dgrad 1.19x slower, its experts' last
// tiles about half empty over 112 k-steps. Spreading those reads over the thread's own rows
// still cost deepseek-v3's gate_up 4% and qwen3-30b-a3b's 8% against the zero fill.)
template <int ROWS, int COLS, int THREADS, bool KMAJOR, class Src, bool BLOCKED = false, bool PREFIX_ROWS = false>
struct TileLoader {
  static constexpr int CHUNKS_PER_ROW = COLS / 8;
  static constexpr int CHUNKS = ROWS * CHUNKS_PER_ROW;
  static_assert(CHUNKS % THREADS == 0, "tile chunks must divide evenly among threads");
  static_assert(THREADS % CHUNKS_PER_ROW == 0, "a thread keeps one column across its chunks");
  static constexpr int PER_THREAD = CHUNKS / THREADS;
  static constexpr int ROW_STEP = THREADS / CHUNKS_PER_ROW;

  // K-major rows keep their pointers, this thread's column included (one index load per tile,
  // not per stage). Recomputing never-gathered rows per stage instead measured more producer
  // spills, not fewer. A missing row: nullptr, or with PREFIX_ROWS the source's fallback row.
  const Src& src;
  int row0, col;                           // this thread's first row and its column
  int exist;                               // PREFIX_ROWS: this thread's rows up to its last that exists
  const bf16_t* rows[KMAJOR ? PER_THREAD : 1];

  MB_DEV TileLoader(const Src& s, int tid) : src(s) {
    row0 = tid / CHUNKS_PER_ROW;
    col = (tid % CHUNKS_PER_ROW) * 8;
    if constexpr (KMAJOR) {
      exist = 0;
#pragma unroll
      for (int i = 0; i < PER_THREAD; ++i) {
        const bf16_t* p = src.row(row0 + i * ROW_STEP);
        if constexpr (PREFIX_ROWS) {
          rows[i] = (p != nullptr ? p : src.fallback()) + col;
          if (p != nullptr) exist = i + 1;
        } else {
          rows[i] = p != nullptr ? p + col : nullptr;
        }
      }
    }
  }

  // k0: first k of this stage.
  MB_DEV void load(bf16_t* smem, int k0) const { load(smem_addr(smem), k0); }
  // The same into the stage at shared-window address `smem`.
  MB_DEV void load(unsigned smem, int k0) const {
    auto at = [&](int r) { return smem + 2u * static_cast<unsigned>(BLOCKED ? swizzle_blocked<ROWS>(r, col) : swizzle<COLS>(r, col)); };
    if constexpr (KMAJOR && PREFIX_ROWS) {
      // The column inside k, once a stage, and the row's index against the count; a false
      // predicate zero-fills and reads nothing, so the address needs no select.
      const bool ok = k0 + col < src.limit;
#pragma unroll
      for (int i = 0; i < PER_THREAD; ++i) cp_async16(at(row0 + i * ROW_STEP), rows[i] + k0, ok && i < exist);
      return;
    } else if constexpr (KMAJOR) {
#pragma unroll
      for (int i = 0; i < PER_THREAD; ++i) {
        const bool ok = rows[i] != nullptr && k0 + col < src.limit;
        cp_async16(at(row0 + i * ROW_STEP), ok ? rows[i] + k0 : src.fallback(), ok);
      }
      return;
    }
    if constexpr (!KMAJOR) {
      // MN-major stage whose k rows all exist and are evenly spaced (weights, h, dH): one
      // pointer and a stride instead of a row lookup per chunk. The per-chunk lookups made a
      // warp-specialised producer issue ~750 instructions per k step and starve its consumers
      // (ncu on mixtral's gate_up_dgrad; docs/performance.md "Decisions").
      if (src.contiguous(k0, ROWS)) {
        const bool ok = col < src.limit;
        const bf16_t* p = ok ? src.row(k0 + row0) + col : src.fallback();
        const i64 step = ok ? static_cast<i64>(ROW_STEP) * src.ld : 0;
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) cp_async16(at(row0 + i * ROW_STEP), p + i * step, ok);
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
      const int r = row0 + i * ROW_STEP;
      const bf16_t* p = src.row(k0 + r);  // MN-major: a missing k row must read zeros
      const bool ok = p != nullptr && col < src.limit;
      cp_async16(at(r), ok ? p + col : src.fallback(), ok);
    }
  }
};

// A [BK][COLS] MN-major tile whose rows are k (and move with it), loaded 16 bytes per
// cp.async into the blocked swizzled layout, MnRowMap's thread layout (whole lines per warp
// copy, G chunks per row pointer). The row keys of the next stage are read one stage early
// (fetch), so a gathered row's index load does not stall the copy issue.
template <int ROWS, int COLS, int THREADS, class Src>
struct MnMajorLoader {
  using Map = MnRowMap<ROWS, COLS, THREADS>;
  static constexpr int G = Map::G, R = Map::R, ROW_STEP = Map::ROW_STEP;
  const Src& src;
  int tid;
  int keys[R];  // row keys of the stage to load next (src.key: -1 = no row)
  int k_first;  // the k of the stage to load next (for sources whose rows are contiguous)

  MB_DEV MnMajorLoader(const Src& s, int t) : src(s), tid(t) {}
  MB_DEV void fetch(int k0) {
    k_first = k0;
    if (src.contiguous(k0, ROWS)) return;  // load() needs no keys (a pointer and a stride)
#pragma unroll
    for (int i = 0; i < R; ++i) keys[i] = src.key(k0 + Map::row(tid, i));
  }
  // The G chunks of tile row r from global row p (nullptr: zero-filled), into the stage at
  // shared-window address `smem`.
  MB_DEV void copy_row(unsigned smem, int r, const bf16_t* p) const {
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int c = Map::col(tid, j);
      const bool ok = p != nullptr && c < src.limit;
      cp_async16(smem + 2u * static_cast<unsigned>(Map::offset(r, c)), ok ? p + c : src.fallback(), ok);
    }
  }
  MB_DEV void load(unsigned smem) const {
    if (src.contiguous(k_first, ROWS)) {  // hg, dH: never gathered (see TileLoader::load)
      const bf16_t* p = src.row(k_first + Map::row(tid, 0));
      const i64 step = static_cast<i64>(ROW_STEP) * src.ld;
#pragma unroll
      for (int i = 0; i < R; ++i) copy_row(smem, Map::row(tid, i), p + i * step);
      return;
    }
#pragma unroll
    for (int i = 0; i < R; ++i) copy_row(smem, Map::row(tid, i), keys[i] >= 0 ? src.at(keys[i]) : nullptr);
  }
};

// The loader of one wgmma operand, stages issued in order: K-major operands keep their rows
// (TileLoader caches the row pointers once); MN-major ones read the row keys of the next stage
// (fetch) right after issuing a stage.
template <int ROWS, int COLS, int THREADS, bool KMAJOR, class Src, bool PREFIX_ROWS = false>
struct StageLoader;
template <int ROWS, int COLS, int THREADS, class Src, bool PREFIX_ROWS>
struct StageLoader<ROWS, COLS, THREADS, true, Src, PREFIX_ROWS> {
  TileLoader<ROWS, COLS, THREADS, true, Src, true, PREFIX_ROWS> loader;
  MB_DEV StageLoader(const Src& s, int tid) : loader(s, tid) {}
  MB_DEV void fetch(int) {}
  MB_DEV void load(bf16_t* smem, int k0) const { loader.load(smem, k0); }
  MB_DEV void load(unsigned smem, int k0) const { loader.load(smem, k0); }
};
template <int ROWS, int COLS, int THREADS, class Src, bool PREFIX_ROWS>
struct StageLoader<ROWS, COLS, THREADS, false, Src, PREFIX_ROWS> {
  // Sources that never gather (TwoPartRows) keep the plain per-stage path: the key split
  // measured 20-25% slower on gate_up_dgrad (docs/performance.md "Decisions").
  static constexpr bool PREFETCH = Src::kMayGather;
  using Loader = typename PickType<PREFETCH, MnMajorLoader<ROWS, COLS, THREADS, Src>,
                                    TileLoader<ROWS, COLS, THREADS, false, Src, true>>::type;
  Loader loader;
  MB_DEV StageLoader(const Src& s, int tid) : loader(s, tid) {}
  MB_DEV void fetch(int k0) {
    if constexpr (PREFETCH) loader.fetch(k0);
  }
  MB_DEV void load(bf16_t* smem, int k0) const { load(smem_addr(smem), k0); }
  MB_DEV void load(unsigned smem, int k0) const {
    if constexpr (PREFETCH) loader.load(smem);
    else loader.load(smem, k0);
  }
};

}  // namespace moeblaze::gemm
