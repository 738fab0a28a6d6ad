// TMA (the Tensor Memory Accelerator, sm_90) loads of the operands that are not gathered:
// one thread of the producer warpgroup issues a whole stage tile with cp.async.bulk.tensor,
// which lands in the 128-byte-swizzled layout the wgmma descriptors read (the host encodes
// the tensor map with CU_TENSOR_MAP_SWIZZLE_128B and a box of [rows][64 k] = 128-byte rows,
// the K-major atom of wgmma_mainloop.cuh) and completes its bytes on the stage's mbarrier.
// The producer's other 127 threads, and its registers and issue slots, stay with the
// gathered operand's cp.async copies.
#pragma once
#include "moeblaze/gemm/wgmma_mainloop.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::gemm {

typedef unsigned long long mbar_t;

// The barrier's current phase completes only when `bytes` more have landed through
// complete_tx (on top of its pending arrivals). Issue before the copies it covers.
MB_DEV void mbar_expect_tx(mbar_t* bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Box at (k, row) of a 2-D tensor map into shared memory (1024-byte aligned for the 128-byte
// swizzle); its bytes complete on `bar`. Out-of-range elements land as zeros and count too.
MB_DEV void tma_load_2d(bf16_t* smem, const TmaMap* map, int k, int row, mbar_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(smem)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(k), "r"(row), "r"(smem_addr(bar))
      : "memory");
}

MB_DEV void tma_prefetch_map(const TmaMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// A K-major operand read by TMA: PARTS tensor maps (W1 and W3 stacked: 2), each giving a
// [rows][64] box at row `row` of the map's [E*rows_per_expert, k] view.
template <int PARTS>
struct TmaRows {
  const TmaMap* map[PARTS];
  int row;
};

template <class Src>
struct IsTma {
  static constexpr bool value = false;
};
template <int P>
struct IsTma<TmaRows<P>> {
  static constexpr bool value = true;
};

// The producer-side loader of a TMA operand, the StageLoader interface plus the barrier:
// thread 0 of the producer announces the stage's bytes on `bar` and issues the boxes.
template <int ROWS_PER_PART, int PARTS>
struct TmaStageLoader {
  static constexpr unsigned BYTES = PARTS * ROWS_PER_PART * 64 * 2;
  const TmaRows<PARTS>& src;
  bool issuer;
  MB_DEV TmaStageLoader(const TmaRows<PARTS>& s, int ptid) : src(s), issuer(ptid == 0) {
    if (issuer)
#pragma unroll
      for (int p = 0; p < PARTS; ++p) tma_prefetch_map(s.map[p]);
  }
  MB_DEV void fetch(int) {}
  MB_DEV void load(bf16_t* smem, int k0, mbar_t* bar) const {
    if (!issuer) return;
    mbar_expect_tx(bar, BYTES);
#pragma unroll
    for (int p = 0; p < PARTS; ++p) tma_load_2d(smem + p * ROWS_PER_PART * 64, src.map[p], k0, src.row, bar);
  }
};

}  // namespace moeblaze::gemm
