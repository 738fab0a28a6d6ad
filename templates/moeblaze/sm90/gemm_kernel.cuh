// The one kernel skeleton of the layer (after CUTLASS's sm90 warp-specialised ping-pong and
// cooperative kernels): a persistent block of one producer warpgroup and two consumer
// warpgroups over a Problem, which names everything a family adds:
//
//   Args                                   the kernel's argument struct (kernel_args.cuh)
//   Mainloop, Epilogue                     its parts (mainloop.cuh; epilogue_*.cuh)
//   Tile problem_tile(args, index, rank)   which tile, .valid false past the last
//   int k_tiles(args, tile)                its k steps (K_STEPS_FIXED: the same for every tile)
//   Operands operands(args, tile)          where the stages come from (operand_*.cuh)
//   Epilogue::Params epilogue(args, tile, thread_idx)
//                                          what the epilogue needs besides the accumulators;
//                                          made by the consumers before the mainloop, so
//                                          loads in it (a tile's gates) hide under it
//
// The skeleton composes the parts' shared storage, sets up the pipeline for the mainloop's
// producers, splits the roles, walks the tiles and orders ping-pong groups. Tiles are numbered
// 0, 1, ... in schedule order until the first invalid one; cluster c (a block, or a pair along
// M) takes c, c + clusters, ...; in a pair, tile `index` is the pair's and `rank` picks the
// block's half (a half past the group's rows still loads its share of B and stores nothing).
#pragma once
#include "moeblaze/sm90/config.cuh"
#include "moeblaze/sm90/mainloop.cuh"

namespace moeblaze::sm90 {

template <class Cfg, class Mainloop, class Epilogue>
struct alignas(1024) KernelStorage {
  typename Mainloop::Storage mainloop;
  typename Epilogue::Storage epilogue;
  typename Cfg::Pipeline::SharedStorage pipeline;
  typename Cfg::OrderBarrier::SharedStorage order;
};

// Dynamic shared memory a kernel of this config takes (the host reserves the same:
// generator kernel_layer_smem_bytes): the stages, the epilogue's staging, 1 KiB of barriers and
// 1 KiB to align the base to the swizzle atoms' 1024 bytes.
template <class Cfg, int STAGING_BYTES>
constexpr int kernel_smem_bytes() {
  return Cfg::STAGES * Cfg::STAGE_BYTES + STAGING_BYTES + 2048;
}

// The block's (or pair's) first tile, the clusters of the grid and the block's rank in its pair,
// read from the special registers (volatile) where they are used: the compiler then cannot keep
// them live through a persistent loop, where values held across the epilogue's register peak
// were spilled (cooperative gate_up 128 x (2 x 128) and its pair on a 16-expert layer).
template <class Cfg>
MB_DEV int cluster_first() {
  uint32_t block;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(block));
  return static_cast<int>(block) / Cfg::CLUSTER_M;
}
template <class Cfg>
MB_DEV int cluster_count() {
  uint32_t blocks;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(blocks));
  return static_cast<int>(blocks) / Cfg::CLUSTER_M;
}

template <class Cfg>
MB_DEV int cluster_rank() {
  return Cfg::CLUSTER_M > 1 ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
}

template <class Cfg, class Problem>
MB_DEV void gemm_kernel(const typename Problem::Args& args) {
  using Mainloop = typename Problem::Mainloop;
  using Epilogue = typename Problem::Epilogue;
  using Storage = KernelStorage<Cfg, Mainloop, Epilogue>;
  using Pipeline = typename Cfg::Pipeline;
  using State = typename Cfg::PipelineState;
  static_assert(sizeof(Storage) + 1024 <= kernel_smem_bytes<Cfg, Epilogue::STAGING_BYTES>(),
                "shared storage exceeds the host's reservation");

  extern __shared__ __align__(128) unsigned char kernel_smem[];
  Storage& s = *reinterpret_cast<Storage*>((reinterpret_cast<unsigned long long>(kernel_smem) + 1023) & ~1023ull);

  const int warp_group = cutlass::canonical_warp_group_idx();
  if (threadIdx.x == 0) Epilogue::init(s.epilogue);

  typename Pipeline::Params pp;
  pp.transaction_bytes = Mainloop::template tma_bytes<decltype(Problem::operands(args, Problem::problem_tile(args, 0, 0)))>();
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Cfg::TILE_THREADS;  // the threads that consume (and release) a stage
  pp.num_producers = Mainloop::FULL_ARRIVALS;
  Pipeline pipeline(s.pipeline, pp, typename Cfg::ClusterShape{});
  typename Cfg::OrderBarrier::Params op;
  op.group_id = warp_group == 2 ? 1 : 0;
  op.group_size = 128;
  typename Cfg::OrderBarrier order(s.order, op);
  // Barriers initialised before any role uses them (in a pair: before the other block's
  // multicasts and arrivals reach them).
  if constexpr (Cfg::CLUSTER_M > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }
  const int rank = cluster_rank<Cfg>();
  const int first = blockIdx.x / Cfg::CLUSTER_M, clusters = gridDim.x / Cfg::CLUSTER_M;

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Mainloop::PRODUCER_REGS>();
    // A gathered operand's producers are the whole warpgroup; TMA alone needs one thread (warp
    // 0's elected lane: lane 0, the pipeline's leader).
    const int ptid = threadIdx.x;
    const bool producer = Mainloop::PRODUCER_THREADS > 1 || (cutlass::canonical_warp_idx_sync() == 0 && cute::elect_one_sync());
    if (producer) {
      State write = cutlass::make_producer_start_state<Pipeline>();
      for (int index = first;; index += clusters) {
        const auto tile = Problem::problem_tile(args, index, rank);
        if (!tile.valid) break;
        Mainloop::load(pipeline, write, s.mainloop, Problem::operands(args, tile), rank, ptid);
      }
      // A pair's block leaves only once both blocks' consumers released every stage: no
      // multicast or remote arrival can reach its shared memory afterwards.
      if constexpr (Cfg::CLUSTER_M > 1) {
        if (ptid == 0) pipeline.producer_tail(write);
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Mainloop::CONSUMER_REGS>();
  State read;  // stage 0, phase 0
  if constexpr (Cfg::PINGPONG) {
    // Group g computes the block's tiles g, g + 2, ...; its stages follow the other group's.
    const int group = warp_group - 1, thread_idx = threadIdx.x % 128;
    auto k_steps_of = [&](int index) {
      if constexpr (Problem::K_STEPS_FIXED) {
        return Problem::k_tiles(args, Problem::problem_tile(args, 0, rank));
      } else {
        const auto other = Problem::problem_tile(args, index, rank);
        return other.valid ? Problem::k_tiles(args, other) : 0;
      }
    };
    if (group == 1) read.advance(k_steps_of(first));
    int iteration = 0;
    for (int index = first + group * clusters;; index += 2 * clusters, ++iteration) {
      const auto tile = Problem::problem_tile(args, index, rank);
      if (!tile.valid) break;
      const int k_tiles = Problem::k_tiles(args, tile);
      const auto epi = Problem::epilogue(args, tile, thread_idx);
      auto acc = Mainloop::make_accumulator();
      order.wait();
      Mainloop::mma(pipeline, read, s.mainloop, acc, k_tiles, thread_idx);
      order.arrive();  // the other group's mainloop may start
      Mainloop::finish(pipeline, read, acc, k_tiles);
      read.advance(k_steps_of(index + clusters));  // past the other group's tile
      order.wait();
      Epilogue::store(s.epilogue, acc, thread_idx, group, epi, iteration);
      order.arrive();  // the staging tile is the other group's
    }
    Epilogue::drain(thread_idx);
  } else {
    const int thread_idx = threadIdx.x - 128;
    for (int iteration = 0;; ++iteration) {
      const int index = cluster_first<Cfg>() + iteration * cluster_count<Cfg>();
      const auto tile = Problem::problem_tile(args, index, cluster_rank<Cfg>());
      if (!tile.valid) break;
      const int k_tiles = Problem::k_tiles(args, tile);
      const auto epi = Problem::epilogue(args, tile, thread_idx);
      auto acc = Mainloop::make_accumulator();
      Mainloop::mma(pipeline, read, s.mainloop, acc, k_tiles, thread_idx);
      Mainloop::finish(pipeline, read, acc, k_tiles);
      Epilogue::store(s.epilogue, acc, thread_idx, 0, epi, iteration);
    }
    Epilogue::drain(thread_idx);
  }
}

}  // namespace moeblaze::sm90
