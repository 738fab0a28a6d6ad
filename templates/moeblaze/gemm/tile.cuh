// The tile configuration of a GEMM (gemm::Tile, the generator's TileConfig on the device side)
// and the shared-memory helpers every mainloop uses.
#pragma once
#include "moeblaze/device.cuh"

namespace moeblaze::gemm {

// The template parameters are TileConfig's fields (generator/kernel_spec.hpp); the glossary of
// docs/design.md explains each. MAINLOOP_: a Mainloop (common.cuh) as an int, which the flags
// WGMMA ... PINGPONG spell out (gemm/mainloop.cuh dispatches on them). TMA_CONTIGUOUS_: the
// operands that are not gathered come by TMA (gemm/tma_loaders.cuh). ALT_ORDER_: the other tile
// order (gemm/scheduler/tile_schedule.cuh). TMA_STORE_: the output tile leaves through shared
// memory by TMA stores (gemm/epilogue/tma_store.cuh): 1 staged whole, 2 staged 64 columns at a
// time in two buffers taken in turn ("_tmastore64"). CLUSTER_: blocks per thread-block cluster
// along M (1 or 2): the two blocks of a pair compute the two halves of a 2*BM-row tile and share
// its B operand's stages, each loading half of them by TMA multicast into both. DIRECT_ARRIVE_:
// the warp-specialised pipeline without the `landed` barriers (gemm/mainloop/warp_specialized.cuh).
// With wgmma WARPS_N = 1 and WARPS_M = BM/16 (cooperative: one 16-row slab per warp) or 4
// (ping-pong: one warpgroup per tile, BM/64 m64 slabs per warp), which is how wgmma lays out its
// accumulators. THREADS counts the threads that hold one tile's accumulators; CONSUMER_THREADS
// all consumers (two groups of THREADS in ping-pong); BLOCK_THREADS is the launch size.
template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_, int NB_ = 1, int MAINLOOP_ = 0,
          int TMA_CONTIGUOUS_ = 0, int ALT_ORDER_ = 0, int TMA_STORE_ = 0, int CLUSTER_ = 1, int DIRECT_ARRIVE_ = 0>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = STAGES_, NB = NB_;
  static constexpr bool TMA_CONTIGUOUS = TMA_CONTIGUOUS_ != 0;
  static constexpr bool ALT_ORDER = ALT_ORDER_ != 0;
  // The consumers go on to the next tile while the TMA stores drain (weight gradients, per-slot outputs).
  static constexpr bool TMA_STORE = TMA_STORE_ != 0;
  static constexpr bool STORE_BLOCKS = TMA_STORE_ == 2;
  static constexpr bool WGMMA = uses_wgmma(Mainloop(MAINLOOP_));
  static constexpr bool WARP_SPECIALIZED = is_warp_specialized(Mainloop(MAINLOOP_));
  static constexpr bool PERSISTENT = is_persistent(Mainloop(MAINLOOP_));
  static constexpr bool PINGPONG = Mainloop(MAINLOOP_) == Mainloop::pingpong;
  static_assert(!TMA_STORE || WARP_SPECIALIZED, "TMA-store epilogues are for warp-specialised tiles");
  static_assert(!TMA_CONTIGUOUS || WARP_SPECIALIZED, "TMA loads are issued by a producer warpgroup");
  static constexpr int CLUSTER = CLUSTER_;
  // The producer's cp.async copies arrive on the consumers' full barrier directly.
  static constexpr bool DIRECT_ARRIVE = DIRECT_ARRIVE_ != 0;
  static_assert(!DIRECT_ARRIVE || (WARP_SPECIALIZED && CLUSTER == 1), "direct arrivals: warp-specialised, no cluster");
  static_assert(CLUSTER == 1 || (CLUSTER == 2 && PERSISTENT && TMA_CONTIGUOUS), "clusters pair persistent TMA tiles");
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static_assert(!PINGPONG || THREADS == 128, "a ping-pong consumer group is one warpgroup");
  static constexpr int CONSUMER_GROUPS = PINGPONG ? 2 : 1;
  static constexpr int CONSUMER_THREADS = THREADS * CONSUMER_GROUPS;
  // The producer is one warpgroup (ptxas allocates registers of wgmma kernels by whole
  // warpgroups: a smaller producer would not leave the consumers more registers).
  static constexpr int PRODUCER_THREADS = WARP_SPECIALIZED ? 128 : 0;
  static constexpr int BLOCK_THREADS = CONSUMER_THREADS + PRODUCER_THREADS;
  static constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
  static constexpr int MT = WTM / 16, NT = WTN / 8;             // mma tiles per warp
  // Tile row of accumulator slab mt of warp row warp_m (then + lane/4, + 8 for the upper half):
  // mma.sync warps own WTM consecutive rows; wgmma warpgroup g (warps 4g..4g+3) owns MT m64
  // slabs, rows [64 MT g, 64 MT (g+1)), and its slab mt gives its warp w rows 64 (MT g + mt) + 16 w
  // (cooperative tiles: one or two slabs a warpgroup; ping-pong: one warpgroup, BM/64 slabs).
  MB_HD static constexpr int acc_row(int warp_m, int mt) {
    // (with one slab per warpgroup, or one warpgroup, the general form equals mt*64 + warp_m*16,
    // which is what those tiles compile: the compiler cannot fold warp_m / 4 for a signed warp_m)
    return !WGMMA                        ? warp_m * WTM + mt * 16
           : (MT == 1 || WARPS_M == 4) ? mt * 64 + warp_m * 16
                                       : ((warp_m >> 2) * MT + mt) * 64 + (warp_m & 3) * 16;
  }
  static_assert(BM % (16 * WARPS_M) == 0 && BN % (8 * WARPS_N) == 0, "warp tile must be 16x8 multiples");
  // bn of 96, 160, 208, 224 (multiples of 16, not of 64) only where every B stage is K-major and
  // loaded by TMA (a box of any row count) and the epilogue stores from registers: the generator's
  // legality rule (generator/kernel_spec.cpp) keeps them there; MN-major stages and the 64-column
  // staging assert 64-column blocks themselves.
  static_assert(BK % 64 == 0 && BM % 64 == 0 && BN % 16 == 0, "bm and bk multiples of 64, bn of 16");
  static_assert(STAGES >= 2, "at least double buffering");
  static constexpr int A_ELEMS = BM * BK, B_ELEMS = NB * BN * BK;
  static constexpr int STAGE_ELEMS = A_ELEMS + B_ELEMS;
  static constexpr int SMEM_BYTES = STAGES * STAGE_ELEMS * 2;
  // TMA_STORE: the bf16 output tile's staging buffer, after the stages (1024-byte aligned: every
  // stage is a multiple of 1 KiB): the whole tile, or with STORE_BLOCKS two [BM][64] blocks.
  // Ping-pong groups each stage their own tile.
  static constexpr int OUT_GROUP_ELEMS = STORE_BLOCKS ? 2 * BM * 64 : BM * BN;
  static constexpr int OUT_ELEMS = TMA_STORE ? OUT_GROUP_ELEMS * CONSUMER_GROUPS : 0;
};

// Which consumer a thread is. Consumers are threads [0, CONSUMER_THREADS), the producer
// warpgroup (warp-specialised tiles) follows. consumer_tid is the thread's index inside its
// tile's consumers (threadIdx.x but in ping-pong, where each group of THREADS owns a tile).
template <class Cfg>
MB_DEV int consumer_group() {
  if constexpr (Cfg::PINGPONG) return static_cast<int>(threadIdx.x) / Cfg::THREADS;
  else return 0;
}
template <class Cfg>
MB_DEV int consumer_tid() {
  if constexpr (Cfg::PINGPONG) return static_cast<int>(threadIdx.x) % Cfg::THREADS;
  else return threadIdx.x;
}
template <class Cfg>
MB_DEV bool is_consumer() {
  return threadIdx.x < Cfg::CONSUMER_THREADS;
}
template <class Cfg>
MB_DEV int producer_tid() {
  return static_cast<int>(threadIdx.x) - Cfg::CONSUMER_THREADS;
}

// std::conditional without the standard library (NVRTC compiles these headers alone).
template <bool B, class T, class F>
struct PickType {
  using type = T;
};
template <class T, class F>
struct PickType<false, T, F> {
  using type = F;
};

// Rounds the dynamic shared memory up to the 1024-byte alignment the swizzled atoms need
// (the host reserves 1 KiB extra for wgmma tiles).
MB_DEV bf16_t* align_1024(bf16_t* p) {
  const unsigned long long a = reinterpret_cast<unsigned long long>(p);
  return reinterpret_cast<bf16_t*>((a + 1023) & ~1023ull);
}

// Dynamic shared memory, 128-byte aligned, shared by every kernel of a translation unit.
MB_DEV bf16_t* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char moeblaze_smem[];
  return reinterpret_cast<bf16_t*>(moeblaze_smem);
}

}  // namespace moeblaze::gemm
