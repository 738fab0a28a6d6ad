// Hopper (sm_90a) mainloop: the same cp.async multi-stage pipeline and swizzled tiles as
// mainloop.cuh, with the tensor-core work issued by warpgroups through wgmma on
// shared-memory descriptors. EXPERIMENTAL: compiled and checked for wgmma in CI, not yet
// verified on a GPU; the tuner offers it only with MOEBLAZE_EXPERIMENTAL_WGMMA=1.
//
// Operands: both K-major (A [BM][64], B [NB*BN][64] per stage). A 64-element (128-byte) row
// with the 16-byte chunk XORed by (row & 7) is exactly wgmma's 128-byte-swizzle K-major
// layout: 8-row atoms of 1024 bytes (stride byte offset), the k16 step inside an atom is a
// 32-byte advance of the start address. Tile bases are 1024-byte aligned.
//
// Warp layout: warpgroup g computes rows [64g, 64g+64) with one m64nBNk16 per k16 step and
// B tile. Its accumulators are the m16n8 C fragments of warp 4g+w (rows 16(4g+w)..+15) for
// n8 blocks 0..BN/8-1, i.e. the layout of gemm::Tile<BM, BN, 64, BM/16, 1>: the epilogues
// written for mma.sync (for_each_pair) read them unchanged.
#pragma once
#include "moeblaze/gemm/mainloop.cuh"
#include "moeblaze/gemm/wgmma_ops.cuh"

namespace moeblaze::gemm {

// Shared-memory matrix descriptor, 128-byte swizzle, K-major (PTX ISA "matrix descriptor"):
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4 (unused for this layout),
// 32-45 stride byte offset >> 4 (1024: one 8-row atom), 62-63 swizzle mode (1 = 128 B).
MB_DEV unsigned long long sw128_desc(const void* smem) {
  const unsigned long long addr = smem_addr(smem);
  return ((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

MB_DEV void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
MB_DEV void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
MB_DEV void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy; wgmma reads it through the async
// proxy.
MB_DEV void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Rounds the dynamic shared memory up to the 1024-byte alignment the swizzled atoms need
// (the host reserves 1 KiB extra for wgmma tiles).
MB_DEV bf16_t* align_1024(bf16_t* p) {
  const unsigned long long a = reinterpret_cast<unsigned long long>(p);
  return reinterpret_cast<bf16_t*>((a + 1023) & ~1023ull);
}

template <class Cfg, class ASrc, class BSrc>
MB_DEV void wgmma_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a_src, const BSrc& b_src,
                           int k_size, bf16_t* smem_raw) {
  static_assert(Cfg::WARPS_N == 1 && Cfg::WTM == 16 && Cfg::MT == 1, "wgmma tiles: one 16-row slab per warp");
  static_assert(Cfg::BM % 64 == 0 && Cfg::BK == 64, "wgmma tiles: whole warpgroups, 64-wide k");
  static_assert(Cfg::BN == 64 || Cfg::BN == 128 || Cfg::BN == 256, "wgmma N");
  constexpr int ACC = Cfg::BN / 2;
  bf16_t* smem = align_1024(smem_raw);
  const int tid = threadIdx.x, warpgroup = tid / 128;
#pragma unroll
  for (int nb = 0; nb < Cfg::NB; ++nb)
#pragma unroll
    for (int nt = 0; nt < Cfg::NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nb][0][nt][i] = 0.f;

  const TileLoader<Cfg::BM, Cfg::BK, Cfg::THREADS, true, ASrc> a_load(a_src, tid);
  const TileLoader<Cfg::NB * Cfg::BN, Cfg::BK, Cfg::THREADS, true, BSrc> b_load(b_src, tid);
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
    fence_proxy_async_smem();
    __syncthreads();  // stage kt visible to the async proxy of every warpgroup
    const int next = kt + Cfg::STAGES - 1;
    if (next < k_tiles) {  // the buffer of stage kt-1: its wgmmas completed last iteration
      bf16_t* stage = smem + (next % Cfg::STAGES) * Cfg::STAGE_ELEMS;
      a_load.load(stage, next * Cfg::BK);
      b_load.load(stage + Cfg::A_ELEMS, next * Cfg::BK);
    }
    cp_async_commit();
    const bf16_t* stage = smem + (kt % Cfg::STAGES) * Cfg::STAGE_ELEMS;
    const unsigned long long a_desc = sw128_desc(stage + warpgroup * 64 * Cfg::BK);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::BK / 16; ++kk)
#pragma unroll
      for (int nb = 0; nb < Cfg::NB; ++nb) {
        const unsigned long long b_desc = sw128_desc(stage + Cfg::A_ELEMS + nb * Cfg::BN * Cfg::BK);
        // k16 step = 32 bytes = 2 units of the start-address field.
        Wgmma<Cfg::BN>::mma(*reinterpret_cast<float(*)[ACC]>(&acc[nb][0][0][0]), a_desc + 2 * kk,
                            b_desc + 2 * kk, 1);
      }
    wgmma_commit();
    wgmma_wait<0>();
  }
  cp_async_wait<0>();
  __syncthreads();
}

// The mainloop a tile config asks for. MN-major operands exist only for mma.sync tiles.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc>
MB_DEV void run_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a, const BSrc& b, int k_size,
                         bf16_t* smem) {
  if constexpr (Cfg::WGMMA) {
    static_assert(A_KMAJOR && B_KMAJOR, "wgmma mainloop: K-major operands only");
    wgmma_mainloop<Cfg>(acc, a, b, k_size, smem);
  } else {
    mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem);
  }
}

}  // namespace moeblaze::gemm
