// The kernel layer's configuration: one struct per compiled kernel naming its tile, pipeline
// depth and schedule, and the CuTe types every part derives from it (the GMMA tiled MMA, the
// operand and staging layouts in shared memory). Built on CuTe (CUTLASS's headers, taken as the
// nvidia-cutlass package): its layout algebra makes every shared-memory offset and wgmma
// descriptor a compile-time constant plus a stage base, which is what keeps the k-step short.
#pragma once
#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "moeblaze/common.cuh"

namespace moeblaze::sm90 {

using Element = cute::bfloat16_t;
using Accum = float;

// How the consumer warpgroups share the tiles. pingpong: each of two warpgroups owns a whole
// tile and they take turns at the tensor cores, one's epilogue under the other's mainloop.
// cooperative: both warpgroups split one tile's rows and run its epilogue together.
enum class Schedule : int { pingpong = 0, cooperative = 1 };

// BM x BN output tiles, BK = 64 (one 128-byte swizzle span of bf16 a row), STAGES operand stages.
// Which dimension of an operand is contiguous in memory: k (K-major: [rows][k], e.g. h, the
// weights of down_proj) or its M / N (MN-major: [k][columns], e.g. W1 read by gate_up_dgrad).
enum class Major : int { k = 0, mn = 1 };

template <Major M>
constexpr cute::GMMA::Major gmma_major() {
  return M == Major::k ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
}

// An operand's stages in the 128-byte swizzle: ROWS x 64 per stage. K-major: [rows][64] (a TMA
// box of [rows][64]); MN-major: 64-column blocks of [64 k][64] one after the other (boxes of
// [64][64]), which is what ordering K before MN in tile_to_shape lays out.
template <Major M, int ROWS, int STAGES>
using StageLayout = decltype(cute::tile_to_shape(
    cute::conditional_t<M == Major::k, cute::GMMA::Layout_K_SW128_Atom<Element>, cute::GMMA::Layout_MN_SW128_Atom<Element>>{},
    cute::make_shape(cute::Int<ROWS>{}, cute::_64{}, cute::Int<STAGES>{}),
    cute::conditional_t<M == Major::k, cute::Step<cute::_1, cute::_2, cute::_3>, cute::Step<cute::_2, cute::_1, cute::_3>>{}));

// CLUSTER_M: blocks per cluster along M (1 or 2). A pair computes two M tiles of one N tile and
// shares their B stages: each block loads half of B by TMA multicast into both.
template <int BM_, int BN_, int STAGES_, Schedule SCHEDULE_, int CLUSTER_M_ = 1, Major MAJOR_A_ = Major::k,
          Major MAJOR_B_ = Major::k>
struct KernelConfig {
  static constexpr Major MAJOR_A = MAJOR_A_, MAJOR_B = MAJOR_B_;
  static constexpr int BM = BM_, BN = BN_, BK = 64, STAGES = STAGES_;
  static constexpr Schedule SCHEDULE = SCHEDULE_;
  static constexpr int CLUSTER_M = CLUSTER_M_;
  static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of one or two blocks along M");
  static_assert(BN % (8 * CLUSTER_M) == 0, "a block's share of B is whole 8-row swizzle atoms");
  using ClusterShape = cute::Shape<cute::Int<CLUSTER_M>, cute::_1, cute::_1>;
  static constexpr bool PINGPONG = SCHEDULE == Schedule::pingpong;
  static constexpr int MMA_WARPGROUPS = 2;
  static constexpr int THREADS = 128 * (MMA_WARPGROUPS + 1);  // warpgroup 0 loads, 1 and 2 compute
  // Threads that hold one tile's accumulators, and the rows each warpgroup owns.
  static constexpr int TILE_THREADS = PINGPONG ? 128 : 256;
  static constexpr int WG_ROWS = PINGPONG ? BM : BM / 2;
  static_assert(BM % 64 == 0 && WG_ROWS % 64 == 0, "a warpgroup's rows are whole m64 slabs");
  static_assert(BN % 64 == 0 && BN <= 256, "output tiles leave in 64-column TMA boxes");
  static_assert(STAGES >= 2, "at least double buffering");
  // Registers after setmaxnreg: the producer needs few, the consumers hold the accumulators
  // (BM x BN / TILE_THREADS floats); 128 x 40 + 256 x 232 = 384 x 168.
  static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;

  using TileShape = cute::Shape<cute::Int<BM>, cute::Int<BN>, cute::Int<BK>>;
  // One m64 x BN wgmma atom; cooperative tiles stack one atom per warpgroup along M.
  using MmaOp = decltype(cute::GMMA::ss_op_selector<Element, Element, Accum,
                                                    cute::Shape<cute::_64, cute::Int<BN>, cute::Int<BK>>,
                                                    gmma_major<MAJOR_A>(), gmma_major<MAJOR_B>()>());
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<PINGPONG ? 1 : 2>, cute::_1, cute::_1>>;
  using TiledMma = decltype(cute::make_tiled_mma(MmaOp{}, AtomLayout{}));

  // The accumulator layout of a BM x W tile (the epilogues' narrower fragments: gate_up's h is
  // half its accumulator's columns). Only its C layout is used; the operands' majors do not
  // change it.
  template <int W>
  using TiledMmaN = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, Accum, cute::Shape<cute::_64, cute::Int<W>, cute::Int<BK>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      AtomLayout{}));

  using SmemLayoutA = StageLayout<MAJOR_A, BM, STAGES>;
  using SmemLayoutB = StageLayout<MAJOR_B, BN, STAGES>;
  static_assert(MAJOR_A == Major::k || BM % 64 == 0, "MN-major stages are whole 64-column blocks");
  static_assert(MAJOR_B == Major::k || BN % 64 == 0, "MN-major stages are whole 64-column blocks");
  // The output tile staged for TMA stores: BN / 64 boxes of [BM][64], one after the other.
  using SmemLayoutD = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                                   cute::make_shape(cute::Int<BM>{}, cute::Int<BN>{})));

  static constexpr int A_STAGE_BYTES = BM * BK * 2, B_STAGE_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
  static constexpr int D_BYTES = BM * BN * 2;

  using Pipeline = cutlass::PipelineTmaAsync<STAGES>;
  using PipelineState = typename Pipeline::PipelineState;
  // Ping-pong: the two warpgroups' mainloops, then their epilogues, in turn.
  using OrderBarrier = cutlass::OrderedSequenceBarrier<2, 2>;
};

}  // namespace moeblaze::sm90
