// Grouped-GEMM mainloop for tensor cores with mma.sync (sm_80+, runs on sm_90a):
// a multi-stage cp.async pipeline filling swizzled shared-memory tiles, ldmatrix
// fragments, fp32 accumulators in registers.
//
// C[BM x (NB*BN)] += A[BM x K] * B[K x (NB*BN)] for one output tile. Operands come from
// "row sources": a small functor that maps a tile row to a global pointer (or nullptr for
// a row outside the problem), which is how the token gather is fused into the load:
//   K-major operand (rows = m or n, contiguous along k): rows are fixed for the whole
//     k loop; source.row(r) points at k = 0 of row r, and source.limit is K.
//   MN-major operand (rows = k, contiguous along m or n): rows move with k;
//     source.row(k) points at the tile's first column, source.limit is the number of
//     valid columns in the tile.
// NB > 1 stacks NB independent B tiles of BN rows (used to load W1 and W3 together, so
// the epilogue holds both A and B for the same output column).
#pragma once
#include "moeblaze/device.cuh"

namespace moeblaze::gemm {

// WGMMA_: 0 = mma.sync warps, 1 = wgmma warpgroups (wgmma_mainloop.cuh), 2 = wgmma consumer
// warpgroups plus one producer warpgroup (ws_mainloop.cuh), 3 = the same, persistent: a block
// walks tiles blockIdx.x, +gridDim.x, ... and its producer fills the next tile's stages while
// the consumers run the epilogue (gemm::for_each_tile). With wgmma WARPS_M = BM/16 and
// WARPS_N = 1, which is how wgmma lays out its accumulators. THREADS counts the warps that
// hold accumulators (the consumers); BLOCK_THREADS is the launch size. TMA_: the operand that
// is not gathered comes by TMA (gemm/tma.cuh; warp-specialised tiles of up_proj, down_proj,
// up_wgrad, down_wgrad).
template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_, int NB_ = 1, int WGMMA_ = 0,
          int TMA_ = 0, int SWAP_ = 0, int TSTORE_ = 0>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = STAGES_, NB = NB_;
  static constexpr bool TMA = TMA_ != 0;
  static constexpr bool SWAP = SWAP_ != 0;  // the other tile order (gemm/tile_schedule.cuh)
  // The output tile leaves through shared memory by TMA stores (gemm/tma_store.cuh), so the
  // consumers go on to the next tile while it drains (weight gradients).
  static constexpr bool TSTORE = TSTORE_ != 0;
  static_assert(!TSTORE || WGMMA_ >= 2, "TMA-store epilogues are for warp-specialised tiles");
  static_assert(!TMA || WGMMA_ >= 2, "TMA loads are issued by a producer warpgroup");
  static constexpr bool WGMMA = WGMMA_ != 0;
  static constexpr bool WARP_SPECIALIZED = WGMMA_ >= 2;
  static constexpr bool PERSISTENT = WGMMA_ == 3;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  // The producer is one warpgroup (ptxas allocates registers of wgmma kernels by whole
  // warpgroups: a smaller producer would not leave the consumers more registers).
  static constexpr int PRODUCER_THREADS = WARP_SPECIALIZED ? 128 : 0;
  static constexpr int BLOCK_THREADS = THREADS + PRODUCER_THREADS;
  static constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
  static constexpr int MT = WTM / 16, NT = WTN / 8;             // mma tiles per warp
  static_assert(BM % (16 * WARPS_M) == 0 && BN % (8 * WARPS_N) == 0, "warp tile must be 16x8 multiples");
  static_assert(BK % 64 == 0 && BM % 64 == 0 && BN % 64 == 0, "tile sides must be multiples of 64");
  static_assert(STAGES >= 2, "at least double buffering");
  static constexpr int A_ELEMS = BM * BK, B_ELEMS = NB * BN * BK;
  static constexpr int STAGE_ELEMS = A_ELEMS + B_ELEMS;
  static constexpr int SMEM_BYTES = STAGES * STAGE_ELEMS * 2;
  // TSTORE: the bf16 output tile's staging buffer, after the stages (1024-byte aligned: every
  // stage is a multiple of 1 KiB).
  static constexpr int OUT_ELEMS = TSTORE ? BM * BN : 0;
};

// Loads a [ROWS][COLS] tile into swizzled shared memory, 16 bytes per cp.async.
// KMAJOR: rows fixed (pointers cached once), the column window moves along k.
// !KMAJOR: rows are k and move, the column window is fixed.
// BLOCKED: columns stored in 64-wide blocks (swizzle_blocked; the wgmma MN-major layout);
// for 64-column tiles both layouts are the same.
template <int ROWS, int COLS, int THREADS, bool KMAJOR, class Src, bool BLOCKED = false>
struct TileLoader {
  static constexpr int CHUNKS_PER_ROW = COLS / 8;
  static constexpr int CHUNKS = ROWS * CHUNKS_PER_ROW;
  static_assert(CHUNKS % THREADS == 0, "tile chunks must divide evenly among threads");
  static_assert(THREADS % CHUNKS_PER_ROW == 0, "a thread keeps one column across its chunks");
  static constexpr int PER_THREAD = CHUNKS / THREADS;
  static constexpr int ROW_STEP = THREADS / CHUNKS_PER_ROW;

  // K-major rows keep their pointers (one index load per tile, not per stage). Recomputing
  // never-gathered rows per stage instead measured more producer spills, not fewer.
  const Src& src;
  int row0, col;                           // this thread's first row and its column
  const bf16_t* rows[KMAJOR ? PER_THREAD : 1];

  MB_DEV TileLoader(const Src& s, int tid) : src(s) {
    row0 = tid / CHUNKS_PER_ROW;
    col = (tid % CHUNKS_PER_ROW) * 8;
    if constexpr (KMAJOR) {
#pragma unroll
      for (int i = 0; i < PER_THREAD; ++i) rows[i] = src.row(row0 + i * ROW_STEP);
    }
  }

  // k0: first k of this stage.
  MB_DEV void load(bf16_t* smem, int k0) const {
    if constexpr (!KMAJOR) {
      // MN-major stage whose k rows all exist and are evenly spaced (weights, h, dH): one
      // pointer and a stride instead of a row lookup per chunk. The per-chunk lookups made a
      // warp-specialised producer issue ~750 instructions per k step and starve its consumers
      // (ncu on mixtral's up_dgrad; docs/performance.md "Decisions").
      if (src.contiguous(k0, ROWS)) {
        const bool ok = col < src.limit;
        const bf16_t* p = ok ? src.row(k0 + row0) + col : src.fallback();
        const i64 step = ok ? static_cast<i64>(ROW_STEP) * src.ld : 0;
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
          const int r = row0 + i * ROW_STEP;
          const int at = BLOCKED ? swizzle_blocked<ROWS>(r, col) : swizzle<COLS>(r, col);
          cp_async16(smem + at, p + i * step, ok);
        }
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
      const int r = row0 + i * ROW_STEP;
      const bf16_t* p;
      bool ok;
      if constexpr (KMAJOR) {
        p = rows[i];
        ok = p != nullptr && k0 + col < src.limit;
        p = ok ? p + k0 + col : nullptr;
      } else {
        p = src.row(k0 + r);
        ok = p != nullptr && col < src.limit;
        p = ok ? p + col : nullptr;
      }
      const int at = BLOCKED ? swizzle_blocked<ROWS>(r, col) : swizzle<COLS>(r, col);
      cp_async16(smem + at, ok ? p : src.fallback(), ok);
    }
  }
};

// Fragment position inside a 16x16 ldmatrix.x4 block for this lane.
struct LaneQuad {
  int q, r;  // which 8x8 matrix this lane addresses, and which row of it
  MB_DEV explicit LaneQuad(int lane) : q(lane >> 3), r(lane & 7) {}
};

template <class Cfg, bool A_KMAJOR, bool B_KMAJOR>
struct Mma {
  using Acc = float[Cfg::NB][Cfg::MT][Cfg::NT][4];
  static_assert(Cfg::NT % 2 == 0, "B fragments load two n8 tiles at once");
  static_assert(B_KMAJOR || Cfg::NB == 1, "stacked B tiles are K-major");

  // One BK-deep step over a stage already in shared memory.
  static MB_DEV void compute(Acc& acc, const bf16_t* sA, const bf16_t* sB, int warp_m, int warp_n,
                             int lane) {
    const LaneQuad lq(lane);
#pragma unroll
    for (int kk = 0; kk < Cfg::BK; kk += 16) {
      unsigned af[Cfg::MT][4];
#pragma unroll
      for (int mt = 0; mt < Cfg::MT; ++mt) {
        const int m_base = warp_m * Cfg::WTM + mt * 16;
        if constexpr (A_KMAJOR) {  // smem [BM][BK]
          const int m = m_base + (lq.q & 1) * 8 + lq.r, k = kk + (lq.q >> 1) * 8;
          ldsm_x4(af[mt], sA + swizzle<Cfg::BK>(m, k));
        } else {  // smem [BK][BM]
          const int k = kk + (lq.q >> 1) * 8 + lq.r, m = m_base + (lq.q & 1) * 8;
          ldsm_x4_trans(af[mt], sA + swizzle<Cfg::BM>(k, m));
        }
      }
#pragma unroll
      for (int nb = 0; nb < Cfg::NB; ++nb) {
#pragma unroll
        for (int nt = 0; nt < Cfg::NT; nt += 2) {
          const int n_base = warp_n * Cfg::WTN + nt * 8;
          unsigned bf[4];
          if constexpr (B_KMAJOR) {  // smem [NB*BN][BK]
            const int n = nb * Cfg::BN + n_base + (lq.q >> 1) * 8 + lq.r, k = kk + (lq.q & 1) * 8;
            ldsm_x4(bf, sB + swizzle<Cfg::BK>(n, k));
          } else {  // smem [BK][BN]
            const int k = kk + (lq.q & 1) * 8 + lq.r, n = n_base + (lq.q >> 1) * 8;
            ldsm_x4_trans(bf, sB + swizzle<Cfg::BN>(k, n));
          }
#pragma unroll
          for (int mt = 0; mt < Cfg::MT; ++mt) {
            mma_bf16_16816(acc[nb][mt][nt], af[mt], bf[0], bf[1]);
            mma_bf16_16816(acc[nb][mt][nt + 1], af[mt], bf[2], bf[3]);
          }
        }
      }
    }
  }
};

// The whole k loop for one output tile. `k_size` is the reduction length; smem holds
// Cfg::SMEM_BYTES. On return every cp.async has landed and shared memory may be reused.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc>
MB_DEV void mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a_src,
                     const BSrc& b_src, int k_size, bf16_t* smem) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
#pragma unroll
  for (int nb = 0; nb < Cfg::NB; ++nb)
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < Cfg::NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nb][mt][nt][i] = 0.f;

  constexpr int A_ROWS = A_KMAJOR ? Cfg::BM : Cfg::BK, A_COLS = A_KMAJOR ? Cfg::BK : Cfg::BM;
  constexpr int B_ROWS = B_KMAJOR ? Cfg::NB * Cfg::BN : Cfg::BK;
  constexpr int B_COLS = B_KMAJOR ? Cfg::BK : Cfg::BN;
  const TileLoader<A_ROWS, A_COLS, Cfg::THREADS, A_KMAJOR, ASrc> a_load(a_src, tid);
  const TileLoader<B_ROWS, B_COLS, Cfg::THREADS, B_KMAJOR, BSrc> b_load(b_src, tid);

  const int k_tiles = (k_size + Cfg::BK - 1) / Cfg::BK;
#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < k_tiles) {
      bf16_t* stage = smem + s * Cfg::STAGE_ELEMS;
      a_load.load(stage, s * Cfg::BK);
      b_load.load(stage + Cfg::A_ELEMS, s * Cfg::BK);
    }
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<Cfg::STAGES - 2>();
    __syncthreads();  // stage kt landed for all threads; stage kt-1 is free to refill
    const int next = kt + Cfg::STAGES - 1;
    if (next < k_tiles) {
      bf16_t* stage = smem + (next % Cfg::STAGES) * Cfg::STAGE_ELEMS;
      a_load.load(stage, next * Cfg::BK);
      b_load.load(stage + Cfg::A_ELEMS, next * Cfg::BK);
    }
    cp_async_commit();
    const bf16_t* stage = smem + (kt % Cfg::STAGES) * Cfg::STAGE_ELEMS;
    Mma<Cfg, A_KMAJOR, B_KMAJOR>::compute(acc, stage, stage + Cfg::A_ELEMS, warp_m, warp_n, lane);
  }
  cp_async_wait<0>();
  __syncthreads();
}

// Calls f(row, col, v0, v1[, w0, w1]) for every accumulator pair of this thread: rows and
// columns are tile-local, (v0, v1) are columns col and col+1 of B tile 0 and (w0, w1) the
// same of B tile 1 when NB == 2.
template <class Cfg, class F>
MB_DEV void for_each_pair(const float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], F&& f) {
  if (threadIdx.x >= Cfg::THREADS) return;  // the producer warpgroup holds no accumulators
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
#pragma unroll
  for (int mt = 0; mt < Cfg::MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_m * Cfg::WTM + mt * 16 + (lane >> 2) + half * 8;
#pragma unroll
      for (int nt = 0; nt < Cfg::NT; ++nt) {
        const int col = warp_n * Cfg::WTN + nt * 8 + (lane & 3) * 2;
        if constexpr (Cfg::NB == 1) {
          f(row, col, acc[0][mt][nt][half * 2], acc[0][mt][nt][half * 2 + 1]);
        } else {
          f(row, col, acc[0][mt][nt][half * 2], acc[0][mt][nt][half * 2 + 1],
            acc[1][mt][nt][half * 2], acc[1][mt][nt][half * 2 + 1]);
        }
      }
    }
}

}  // namespace moeblaze::gemm
