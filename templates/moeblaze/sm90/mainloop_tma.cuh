// The mainloop of tiles whose operands both come by TMA (no gather): the producer's loads and
// the consumers' GMMA k-loop over CUTLASS's PipelineTmaAsync. Each operand is K-major or
// MN-major (config.cuh Major), its boxes named by an operand source (operand_tma.cuh) and landing
// in CuTe's 128-byte-swizzle layout.
#pragma once
#include "moeblaze/sm90/operand_tma.cuh"

namespace moeblaze::sm90 {

template <class Cfg>
struct TmaMainloop {
  using Pipeline = typename Cfg::Pipeline;
  using State = typename Cfg::PipelineState;
  using TiledMma = typename Cfg::TiledMma;

  struct Storage {
    cute::array_aligned<Element, cute::cosize_v<typename Cfg::SmemLayoutA>, 1024> a;
    cute::array_aligned<Element, cute::cosize_v<typename Cfg::SmemLayoutB>, 1024> b;
  };

  // The producer: one thread issues every stage of a tile; the full barrier counts its bytes.
  // In a cluster pair each block issues its share of B (operand_tma.cuh), multicast into both
  // blocks' stage, so each full barrier still receives a whole stage.
  template <class Operands>
  static MB_DEV void load(Pipeline& pipe, State& st, Storage& s, const Operands& op, int rank) {
    static_assert(Operands::ASource_MAJOR == Cfg::MAJOR_A && Operands::BSource_MAJOR == Cfg::MAJOR_B,
                  "the operand sources' layouts are the config's");
    for (int k = 0; k < op.k_tiles; ++k) {
      pipe.producer_acquire(st);
      uint64_t* full = pipe.producer_get_barrier(st);
      const int stage = st.index();
      op.a.template load<Cfg::BM, 1>(k, full, s.a.data() + stage * (Cfg::BM * Cfg::BK), rank);
      op.b.template load<Cfg::BN, Cfg::CLUSTER_M>(k, full, s.b.data() + stage * (Cfg::BN * Cfg::BK), rank);
      ++st;
    }
  }

  // An accumulator tile: the thread's part of a BM x BN fp32 tile.
  static MB_DEV auto make_accumulator() {
    return cute::partition_fragment_C(TiledMma{}, cute::Shape<cute::Int<Cfg::BM>, cute::Int<Cfg::BN>>{});
  }

  // The consumers' k-loop: issues every k step's wgmmas, waits for a stage before its first use
  // and releases it once the wgmmas after it are issued (one batch in flight). Leaves the last
  // batch in flight and the last stage held: finish() waits for them, so a ping-pong group can
  // hand the tensor cores to the other group first. `read` advances by k_tiles.
  template <class Acc>
  static MB_DEV void mma(Pipeline& pipe, State& read, Storage& s, Acc& acc, int k_tiles, int thread_idx) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(s.a.data()), typename Cfg::SmemLayoutA{});  // (BM, BK, STAGES)
    Tensor sB = make_tensor(make_smem_ptr(s.b.data()), typename Cfg::SmemLayoutB{});  // (BN, BK, STAGES)
    TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_slice(thread_idx);
    Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // descriptors (MMA, MMA_M, MMA_K, STAGES)
    Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // descriptors (MMA, MMA_N, MMA_K, STAGES)

    State release = read;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(acc);
    pipe.consumer_wait(read, pipe.consumer_try_wait(read));
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tCrA); ++kb) {
      cute::gemm(tiled_mma, tCrA(_, _, kb, read.index()), tCrB(_, _, kb, read.index()), acc);
      tiled_mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    ++read;
    warpgroup_fence_operand(acc);
    CUTE_NO_UNROLL
    for (int k = 1; k < k_tiles; ++k) {
      pipe.consumer_wait(read, pipe.consumer_try_wait(read));
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      cute::gemm(tiled_mma, tCrA(_, _, _, read.index()), tCrB(_, _, _, read.index()), acc);
      warpgroup_commit_batch();
      warpgroup_wait<1>();  // the previous k step's wgmmas are done with their stage
      warpgroup_fence_operand(acc);
      pipe.consumer_release(release);
      ++read;
      ++release;
    }
    warpgroup_fence_operand(acc);
  }

  // Waits for the last batch and releases the stage mma() kept (the one before `read`).
  template <class Acc>
  static MB_DEV void finish(Pipeline& pipe, State read, Acc& acc) {
    cute::warpgroup_wait<0>();
    cute::warpgroup_fence_operand(acc);
    State last = read;
    last.advance(Cfg::STAGES - 1);  // read - 1, modulo the stages (with its phase)
    pipe.consumer_release(last);
  }
};

}  // namespace moeblaze::sm90
