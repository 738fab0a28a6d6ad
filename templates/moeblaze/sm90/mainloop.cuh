// The layer's mainloop: the producer's loads and the consumers' GMMA k-loop over CUTLASS's
// PipelineTmaAsync. Each operand comes from an operand source: by TMA (operand_tma.cuh; one
// thread issues a stage's boxes) or gathered rows (operand_gather.cuh; the producer warpgroup's
// 128 threads copy them with cp.async). Each operand is K-major or MN-major (config.cuh Major)
// and lands in CuTe's 128-byte-swizzle layout.
//
// A stage's full barrier completes when the TMA bytes have landed (the expect_tx of the leading
// producer thread) and, with a gathered operand, when each of the 128 copying threads' cp.async
// copies have (cp.async.mbarrier.arrive.noinc, one arrival each: the barrier counts 1 + 128).
// cp.async writes through the generic proxy and wgmma reads through the async proxy, so the
// consumers fence the proxies after the wait (as the hand-written direct-arrival loaders do).
#pragma once
#include "moeblaze/sm90/operand_gather.cuh"
#include "moeblaze/sm90/operand_tma.cuh"

namespace moeblaze::sm90 {

template <class Cfg, bool GATHERED = false>
struct Mainloop {
  using Pipeline = typename Cfg::Pipeline;
  using State = typename Cfg::PipelineState;
  using TiledMma = typename Cfg::TiledMma;

  // Producer threads that run load(): one issues the TMA boxes; a gathered operand needs the
  // whole producer warpgroup. Arrivals a stage's full barrier waits for.
  static constexpr int PRODUCER_THREADS = GATHERED ? kGatherThreads : 1;
  static constexpr int FULL_ARRIVALS = GATHERED ? 1 + kGatherThreads : 1;
  // Registers after setmaxnreg. A gathered producer keeps its rows' indices and addresses:
  // 56 (QuACK's budget with a gathered A) and 224 for the consumers (128 x 56 + 256 x 224 <= 64K).
  static constexpr int PRODUCER_REGS = GATHERED ? 56 : Cfg::PRODUCER_REGS;
  static constexpr int CONSUMER_REGS = GATHERED ? 224 : Cfg::CONSUMER_REGS;
  // Bytes of a stage that come by TMA (each block's whole stage, a pair's multicast share included).
  template <class Operands>
  static constexpr int tma_bytes() {
    return (Operands::A_GATHERED ? 0 : Cfg::A_STAGE_BYTES) + (Operands::B_GATHERED ? 0 : Cfg::B_STAGE_BYTES);
  }

  struct Storage {
    cute::array_aligned<Element, cute::cosize_v<typename Cfg::SmemLayoutA>, 1024> a;
    cute::array_aligned<Element, cute::cosize_v<typename Cfg::SmemLayoutB>, 1024> b;
  };

  // Every producer thread (ptid in [0, PRODUCER_THREADS)) runs this for a tile. Thread 0 arms
  // each stage's transaction count (the pipeline's leader) and issues its TMA boxes; with a
  // gathered operand every thread copies its share and arrives when its copies land. In a
  // cluster pair each block issues its share of B (operand_tma.cuh), multicast into both
  // blocks' stage, so each full barrier still receives a whole stage.
  template <class Operands>
  static MB_DEV void load(Pipeline& pipe, State& st, Storage& s, const Operands& op, int rank, int ptid) {
    static_assert(Operands::A_MAJOR == Cfg::MAJOR_A && Operands::B_MAJOR == Cfg::MAJOR_B,
                  "the operand sources' layouts are the config's");
    static_assert((Operands::A_GATHERED || Operands::B_GATHERED) == GATHERED, "the mainloop's kind is its operands'");
    auto a_copy = thread_copy<Cfg::BM>(op.a, ptid);  // what each copying thread keeps (gathered sources)
    auto b_copy = thread_copy<Cfg::BN>(op.b, ptid);
    // Shared-window addresses of the stages, converted once (not a copy at a time).
    const uint32_t a_window = cute::cast_smem_ptr_to_uint(s.a.data()), b_window = cute::cast_smem_ptr_to_uint(s.b.data());
    for (int k = 0; k < op.k_tiles; ++k) {
      pipe.producer_acquire(st);
      uint64_t* full = pipe.producer_get_barrier(st);
      const int stage = st.index();
      if (ptid == 0) {
        if constexpr (!Operands::A_GATHERED)
          op.a.template load<Cfg::BM, 1>(k, full, s.a.data() + stage * (Cfg::BM * Cfg::BK), rank);
        if constexpr (!Operands::B_GATHERED)
          op.b.template load<Cfg::BN, Cfg::CLUSTER_M>(k, full, s.b.data() + stage * (Cfg::BN * Cfg::BK), rank);
      }
      if constexpr (Operands::A_GATHERED) op.a.copy(a_copy, k, a_window + stage * Cfg::A_STAGE_BYTES);
      if constexpr (Operands::B_GATHERED) op.b.copy(b_copy, k, b_window + stage * Cfg::B_STAGE_BYTES);
      if constexpr (GATHERED) cutlass::arch::cpasync_barrier_arrive_noinc(full);
      ++st;
    }
  }

  // An accumulator tile: the thread's part of a BM x BN fp32 tile.
  static MB_DEV auto make_accumulator() {
    return cute::partition_fragment_C(TiledMma{}, cute::Shape<cute::Int<Cfg::BM>, cute::Int<Cfg::BN>>{});
  }

  // Waits for a stage; with gathered operands also orders their cp.async (generic-proxy)
  // writes before the wgmmas' async-proxy reads.
  static MB_DEV void wait_stage(Pipeline& pipe, State read) {
    pipe.consumer_wait(read, pipe.consumer_try_wait(read));
    if constexpr (GATHERED) cutlass::arch::fence_view_async_shared();
  }

  // The consumers' k-loop: issues every k step's wgmmas, waits for a stage before its first use
  // and releases it once the wgmmas after it are issued (one batch in flight). Leaves the last
  // batch in flight and the last stage held: finish() waits for them, so a ping-pong group can
  // hand the tensor cores to the other group first. `read` advances by k_tiles. A tile without
  // k steps (a weight gradient's empty expert) is zero.
  template <class Acc>
  static MB_DEV void mma(Pipeline& pipe, State& read, Storage& s, Acc& acc, int k_tiles, int thread_idx) {
    using namespace cute;
    if (k_tiles <= 0) {
      clear(acc);
      return;
    }
    Tensor sA = make_tensor(make_smem_ptr(s.a.data()), typename Cfg::SmemLayoutA{});  // (BM, BK, STAGES)
    Tensor sB = make_tensor(make_smem_ptr(s.b.data()), typename Cfg::SmemLayoutB{});  // (BN, BK, STAGES)
    TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_slice(thread_idx);
    Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // descriptors (MMA, MMA_M, MMA_K, STAGES)
    Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // descriptors (MMA, MMA_N, MMA_K, STAGES)

    State release = read;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(acc);
    wait_stage(pipe, read);
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
      wait_stage(pipe, read);
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
  static MB_DEV void finish(Pipeline& pipe, State read, Acc& acc, int k_tiles) {
    if (k_tiles <= 0) return;
    cute::warpgroup_wait<0>();
    cute::warpgroup_fence_operand(acc);
    State last = read;
    last.advance(Cfg::STAGES - 1);  // read - 1, modulo the stages (with its phase)
    pipe.consumer_release(last);
  }
};

template <class Cfg>
using TmaMainloop = Mainloop<Cfg, false>;

}  // namespace moeblaze::sm90
