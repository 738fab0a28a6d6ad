// The accumulator fragments of a tile: zeroing, the compiler fence after an asynchronous
// wgmma, and the walk over (row, column) pairs that every register epilogue is written with.
#pragma once
#include "moeblaze/gemm/tile.cuh"

namespace moeblaze::gemm {

template <int NB, int MT, int NT>
MB_DEV void zero_accumulators(float (&acc)[NB][MT][NT][4]) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nb][mt][nt][i] = 0.f;
}

// setmaxnreg needs each role to be code of its own (for_each_tile): when the epilogue was
// shared code after the role split, ptxas held the whole kernel to the producer's budget.

// Keeps the compiler from moving accumulator reads above the wgmma wait (the registers are
// written asynchronously, which the asm constraints of the issuing statement cannot say).
template <int NB, int MT, int NT>
MB_DEV void fence_accumulators(float (&acc)[NB][MT][NT][4]) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(acc[nb][mt][nt][i])::"memory");
}

// Calls f(row, col, v0, v1[, w0, w1]) for every accumulator pair of this thread: rows and
// columns are tile-local, (v0, v1) are columns col and col+1 of B tile 0 and (w0, w1) the
// same of B tile 1 when NB == 2.
template <class Cfg, class F>
MB_DEV void for_each_pair(const float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], F&& f) {
  if (!is_consumer<Cfg>()) return;  // the producer warpgroup holds no accumulators
  const int ctid = consumer_tid<Cfg>();
  const int lane = ctid & 31, warp = ctid >> 5;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
#pragma unroll
  for (int mt = 0; mt < Cfg::MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = Cfg::acc_row(warp_m, mt) + (lane >> 2) + half * 8;
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
