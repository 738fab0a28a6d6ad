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
#include "moeblaze/gemm/loaders.cuh"
#include "moeblaze/ptx/mma_sync.cuh"

namespace moeblaze::gemm {

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

}  // namespace moeblaze::gemm
