// Hopper (sm_90a) warp-specialised mainloop: one producer warpgroup fills the stages, the
// consumer warpgroups only issue wgmma. Same shared-memory tile layouts and descriptors as
// wgmma_mainloop.cuh (128-byte swizzle, MN-major operands in 64-column blocks), same
// accumulator layout, so every epilogue written for gemm::for_each_pair runs unchanged.
//
// Threads: consumers are threads [0, Cfg::THREADS) (warpgroup g computes rows [64g, 64g+64)),
// the producer warpgroup is threads [Cfg::THREADS, Cfg::THREADS + 128). Epilogues act on
// consumer threads only (for_each_pair skips the producer).
//
// Pipeline, per stage s (three mbarriers):
//   landed[s]  (128 arrivals): each producer thread's cp.async.mbarrier.arrive.noinc fires
//              when that thread's copies into the stage have completed.
//   full[s]    (128 arrivals): a producer thread that saw landed[s] complete fences its
//              view of the stage into the async proxy (cp.async writes through the generic
//              proxy, wgmma reads through the async proxy) and arrives; the consumers wait
//              on full[s] and then issue wgmma on the stage.
//   empty[s]   (one arrival per consumer warp): a consumer warp arrives once the wgmma group
//              that read the stage has completed; the producer waits on it before refilling.
// The producer never blocks on a single event: it runs a small loop that issues the next
// stage when its buffer is empty and publishes the oldest stage once it has landed, so every
// free buffer is in flight at once and a landed stage is published even while the producer
// waits for a buffer. Consumers keep one wgmma group in flight across stages.
//
// Gathered MN-major operands (the weight-gradient reductions over an expert's slots) read
// their row indices one stage ahead (StageLoader), so the index load latency is off the
// issue path.
#pragma once
#include "moeblaze/gemm/wgmma_mainloop.cuh"

namespace moeblaze::gemm {

// ---- mbarrier vocabulary (PTX ISA "mbarrier") -------------------------------------------
typedef unsigned long long mbar_t;

MB_DEV void mbar_init(mbar_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Whether the phase of the given parity has completed (non-blocking).
MB_DEV bool mbar_test(mbar_t* bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
MB_DEV void mbar_wait(mbar_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nMB_WAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra MB_WAIT_%=;\n}\n" ::"r"(
          smem_addr(bar)),
      "r"(parity)
      : "memory");
}
MB_DEV void mbar_arrive(mbar_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives on `bar` when every cp.async this thread issued so far has completed; counts as one
// of the arrivals the barrier was initialised with.
MB_DEV void cp_async_arrive_noinc(mbar_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// No setmaxnreg: with it ptxas holds the whole kernel to the smaller (producer) budget and
// spills; without it every suite-shape kernel fits the 168 registers of a 384-thread block.

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

template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc>
MB_DEV void ws_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a_src, const BSrc& b_src,
                        int k_size, bf16_t* smem_raw) {
  static_assert(Cfg::WARPS_N == 1 && Cfg::WTM == 16 && Cfg::MT == 1, "wgmma tiles: one 16-row slab per warp");
  static_assert(Cfg::BM % 64 == 0 && Cfg::BK == 64, "wgmma tiles: whole warpgroups, 64-wide k");
  static_assert(B_KMAJOR || Cfg::NB == 1, "stacked B tiles are K-major");
  constexpr int S = Cfg::STAGES, CONSUMER_WARPS = Cfg::THREADS / 32;
  __shared__ mbar_t landed[S], full[S], empty[S];
  bf16_t* smem = align_1024(smem_raw);
  const int tid = threadIdx.x;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mbar_init(&landed[s], 128);
      mbar_init(&full[s], 128);
      mbar_init(&empty[s], CONSUMER_WARPS);
    }
  }
  zero_accumulators(acc);
  __syncthreads();
  const int k_tiles = (k_size + Cfg::BK - 1) / Cfg::BK;

  if (tid >= Cfg::THREADS) {  // ---- producer warpgroup
    const int ptid = tid - Cfg::THREADS;
    constexpr int A_ROWS = A_KMAJOR ? Cfg::BM : Cfg::BK, A_COLS = A_KMAJOR ? Cfg::BK : Cfg::BM;
    constexpr int B_ROWS = B_KMAJOR ? Cfg::NB * Cfg::BN : Cfg::BK, B_COLS = B_KMAJOR ? Cfg::BK : Cfg::BN;
    StageLoader<A_ROWS, A_COLS, 128, A_KMAJOR, ASrc> a_load(a_src, ptid);
    StageLoader<B_ROWS, B_COLS, 128, B_KMAJOR, BSrc> b_load(b_src, ptid);
    a_load.fetch(0);
    b_load.fetch(0);
    int issued = 0, published = 0;
    while (published < k_tiles) {
      if (issued < k_tiles) {
        const int s = issued % S;
        if (issued < S || mbar_test(&empty[s], ((issued / S) & 1) ^ 1)) {
          bf16_t* stage = smem + s * Cfg::STAGE_ELEMS;
          a_load.load(stage, issued * Cfg::BK);
          b_load.load(stage + Cfg::A_ELEMS, issued * Cfg::BK);
          cp_async_arrive_noinc(&landed[s]);
          ++issued;
          a_load.fetch(issued * Cfg::BK);
          b_load.fetch(issued * Cfg::BK);
        }
      }
      if (published < issued) {
        const int s = published % S;
        if (mbar_test(&landed[s], (published / S) & 1)) {
          fence_proxy_async_smem();
          mbar_arrive(&full[s]);
          ++published;
        }
      }
    }
  } else {  // ---- consumer warpgroups
    const int warpgroup = tid / 128, lane = tid & 31;
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % S;
      mbar_wait(&full[s], (kt / S) & 1);
      issue_stage<Cfg, A_KMAJOR, B_KMAJOR>(acc, smem + s * Cfg::STAGE_ELEMS, warpgroup);
      wgmma_wait<1>();  // the group of stage kt-1 has completed: hand its buffer back
      if (kt > 0 && lane == 0) mbar_arrive(&empty[(kt - 1) % S]);
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
  }
  __syncthreads();  // every copy landed (published == k_tiles) and every wgmma completed
}

// The mainloop a tile config asks for: mma.sync, wgmma with a cp.async pipeline shared by
// all warps, or warp-specialised wgmma.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc>
MB_DEV void run_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a, const BSrc& b, int k_size,
                         bf16_t* smem) {
  if constexpr (Cfg::WARP_SPECIALIZED) {
    ws_mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem);
  } else if constexpr (Cfg::WGMMA) {
    wgmma_mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem);
  } else {
    mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem);
  }
}

}  // namespace moeblaze::gemm
