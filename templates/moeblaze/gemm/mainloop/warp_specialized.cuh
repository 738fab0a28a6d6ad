// Hopper (sm_90a) warp-specialised mainloop: one producer warpgroup fills the stages, the
// consumer warpgroups only issue wgmma. Same shared-memory tile layouts and descriptors as
// wgmma_multistage.cuh (128-byte swizzle, MN-major operands in 64-column blocks), same
// accumulator layout, so every epilogue written for gemm::for_each_pair runs unchanged.
//
// Threads: consumers are threads [0, Cfg::THREADS) (warpgroup g computes rows [64g, 64g+64)),
// the producer warpgroup is threads [Cfg::THREADS, Cfg::BLOCK_THREADS). The two roles run as
// separate code (for_each_tile) with their own register budgets (setmaxnreg); epilogues run
// on the consumers only.
//
// Pipeline, per stage s (three mbarriers):
//   landed[s]  (one arrival per producer thread): each producer thread's
//              cp.async.mbarrier.arrive.noinc fires when its copies into the stage completed.
//   full[s]    (one arrival per producer thread): a producer thread that saw landed[s]
//              complete fences its view of the stage into the async proxy (cp.async
//              writes through the generic proxy, wgmma reads through the async proxy) and
//              arrives; the consumers wait on full[s] and then issue wgmma on the stage.
//   empty[s]   (one arrival per consumer warp): a consumer warp arrives once the wgmma group
//              that read the stage has completed; the producer waits on it before refilling.
// The producer never blocks on a single event: it runs a small loop that issues the next
// stage when its buffer is empty and publishes the oldest stage once it has landed, so every
// free buffer is in flight at once and a landed stage is published even while the producer
// waits for a buffer. Consumers keep one wgmma group in flight across stages.
//
// Direct arrivals (Cfg::DIRECT_ARRIVE, "_directarrive"): no landed[s]. Each producer thread's
// cp.async.mbarrier.arrive.noinc goes to full[s] itself, which thus completes when the TMA
// bytes and every thread's copies have landed; the consumers fence the async proxy after their
// wait (the copies were written through the generic proxy). The producer only waits for empty
// buffers: no polling, and no fence and second arrival per stage on its issue path.
//
// Persistent tiles (Mainloop::persistent and pingpong): the barriers and the stage counter
// live across the block's tiles (WsPipe), consumers release every stage including a tile's
// last, and the producer starts the next tile's loads while the consumers run the epilogue.
//
// Gathered MN-major operands (the weight-gradient reductions over an expert's slots) read
// their row indices one stage ahead (StageLoader), so the index load latency is off the
// issue path.
#pragma once
#include "moeblaze/gemm/mainloop/wgmma_multistage.cuh"
#include "moeblaze/gemm/tma_loaders.cuh"
#include "moeblaze/ptx/cluster.cuh"
#include "moeblaze/ptx/mbarrier.cuh"
#include "moeblaze/ptx/warpgroup.cuh"

namespace moeblaze::gemm {

// Named barriers of warp-specialised blocks: 1 the cooperative consumers; ping-pong: 2 + g the
// consumers of group g, 4 + g "group g may run its mainloop".
constexpr int kConsumerBarrier = 1, kGroupBarrier = 2, kOrderBarrier = 4;

// Barrier among the consumers of one tile only: epilogues that share data through shared memory
// sync with this, since a persistent block's producer is already on the next tile (and, in
// ping-pong, the other consumer group on another tile). Blocks without a producer use
// __syncthreads.
template <class Cfg>
MB_DEV void consumer_sync() {
  if constexpr (Cfg::PINGPONG) bar_sync(kGroupBarrier + consumer_group<Cfg>(), Cfg::THREADS);
  else if constexpr (Cfg::WARP_SPECIALIZED) asm volatile("bar.sync 1, %0;\n" ::"n"(Cfg::THREADS) : "memory");
  else __syncthreads();
}

// Pipeline of a warp-specialised block: its barriers, initialised once per block, and the
// number of k stages run by the block's earlier tiles (`it`, the same on every thread:
// producer and consumers walk the same tiles). Stage s of the block's i-th k step is i % S,
// and every barrier's phase parity follows from i, so the pipeline runs on across tiles.
// The loops keep (stage, parity) as a StageCursor, derived from `it` once a tile. Barriers are
// also named by shared-window address (`addr`): converted once, not at every wait and arrive.
template <class Cfg>
struct WsPipe {
  static constexpr int S = Cfg::STAGES;
  mbar_t* bars;  // landed[S], full[S], empty[S]
  unsigned addr;  // smem_addr(bars)
  int it;
  MB_DEV mbar_t* full(int s) const { return bars + S + s; }
  MB_DEV unsigned landed_at(int s) const { return addr + 8u * s; }
  MB_DEV unsigned full_at(int s) const { return addr + 8u * (S + s); }
  MB_DEV unsigned empty_at(int s) const { return addr + 8u * (2 * S + s); }
};

// The stage buffer and phase parity of a running k-step count, advanced without a division.
template <int S>
struct StageCursor {
  int stage;
  unsigned parity;
  MB_DEV explicit StageCursor(int count) : stage(count % S), parity((count / S) & 1) {}
  MB_DEV void advance() {
    if (++stage == S) {
      stage = 0;
      parity ^= 1;
    }
  }
};
struct NoPipe {};

template <class Cfg>
MB_DEV WsPipe<Cfg> make_ws_pipe() {
  constexpr int S = Cfg::STAGES;
  __shared__ mbar_t bars[3 * S];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mbar_init(&bars[s], Cfg::PRODUCER_THREADS);
      mbar_init(&bars[S + s], Cfg::PRODUCER_THREADS);
      // A cluster pair's stages are written by both blocks' producers (multicast): a stage is
      // free once the consumers of both blocks have released it.
      mbar_init(&bars[2 * S + s], Cfg::THREADS / 32 * Cfg::CLUSTER);
    }
    if constexpr (Cfg::CLUSTER > 1) fence_mbarrier_init_cluster();
  }
  if constexpr (Cfg::CLUSTER > 1) cluster_sync();  // the partner's barriers exist before any remote arrive
  else __syncthreads();
  return WsPipe<Cfg>{bars, smem_addr(bars), 0};
}

// The producer's part of one tile: issue the tile's k stages into free buffers and publish
// each once landed. Returns when the last stage is published; the consumers may still be on
// earlier stages.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc>
MB_DEV void ws_produce(const ASrc& a_src, const BSrc& b_src, int k_size, bf16_t* smem_raw, WsPipe<Cfg>& pipe) {
  constexpr int S = Cfg::STAGES;
  bf16_t* smem = align_1024(smem_raw);
  const unsigned smem_at = smem_addr(smem);
  const int ptid = producer_tid<Cfg>();
  const int k_tiles = (k_size + Cfg::BK - 1) / Cfg::BK;
  const int base = pipe.it, end = base + k_tiles;  // the block's k steps of this tile: [base, end)
  constexpr int A_ROWS = A_KMAJOR ? Cfg::BM : Cfg::BK, A_COLS = A_KMAJOR ? Cfg::BK : Cfg::BM;
  constexpr int B_ROWS = B_KMAJOR ? Cfg::NB * Cfg::BN : Cfg::BK, B_COLS = B_KMAJOR ? Cfg::BK : Cfg::BN;
  // Each operand by TMA (TmaRows / TmaMnRows sources) or by the producer's cp.async copies.
  // A's rows are a tile's slots, those that exist a prefix: one compare a copy (TileLoader).
  using ALoad = LoaderFor<A_ROWS, A_COLS, Cfg::PRODUCER_THREADS, A_KMAJOR, ASrc, 1, true>;
  using BLoad = LoaderFor<B_ROWS, B_COLS, Cfg::PRODUCER_THREADS, B_KMAJOR, BSrc, Cfg::CLUSTER>;
  typename ALoad::type a_load(a_src, ptid);
  typename BLoad::type b_load(b_src, ptid);
  a_load.fetch(0);
  b_load.fetch(0);
  // Stage s's operands: TMA ones by generic pointer (one thread), copies by shared-window address.
  auto load_stage = [&](int s, int k0) {
    bf16_t* stage = smem + s * Cfg::STAGE_ELEMS;
    const unsigned stage_at = smem_at + 2u * static_cast<unsigned>(s * Cfg::STAGE_ELEMS);
    load_operand<ALoad::kTma>(a_load, stage, stage_at, k0, pipe.full(s));
    load_operand<BLoad::kTma>(b_load, stage + Cfg::A_ELEMS, stage_at + 2u * Cfg::A_ELEMS, k0, pipe.full(s));
  };
  if constexpr (Cfg::DIRECT_ARRIVE) {
    StageCursor<S> c(base);
    for (int issued = base; issued < end; ++issued, c.advance()) {
      if (issued >= S) mbar_wait(pipe.empty_at(c.stage), c.parity ^ 1);
      const int k0 = (issued - base) * Cfg::BK;
      load_stage(c.stage, k0);
      cp_async_arrive_noinc(pipe.full_at(c.stage));
      a_load.fetch(k0 + Cfg::BK);
      b_load.fetch(k0 + Cfg::BK);
    }
    pipe.it = end;
    return;
  }
  int issued = base, published = base;
  StageCursor<S> in(base), out(base);
  while (published < end) {
    if (issued < end) {
      if (issued < S || mbar_test(pipe.empty_at(in.stage), in.parity ^ 1)) {
        const int k0 = (issued - base) * Cfg::BK;
        // TMA bytes complete on full[s], which also waits for every producer thread's arrival
        // after landed[s] (the cp.async copies): the consumers see both operands.
        load_stage(in.stage, k0);
        cp_async_arrive_noinc(pipe.landed_at(in.stage));
        ++issued;
        in.advance();
        a_load.fetch(k0 + Cfg::BK);
        b_load.fetch(k0 + Cfg::BK);
      }
    }
    if (published < issued) {
      if (mbar_test(pipe.landed_at(out.stage), out.parity)) {
        fence_proxy_async_smem();
        mbar_arrive(pipe.full_at(out.stage));
        ++published;
        out.advance();
      }
    }
  }
  pipe.it = end;
}

// A consumer warp hands a stage buffer back: to its own producer, and in a cluster pair also to
// the partner's, whose multicast writes into this block's buffer too.
template <class Cfg>
MB_DEV void release_stage(unsigned empty) {
  mbar_arrive(empty);
  if constexpr (Cfg::CLUSTER == 2) mbar_arrive_cluster(empty, cluster_ctarank() ^ 1);
}

// Work the consumers start a few k-steps before their mainloop ends, for the epilogue: right
// after issuing the wgmma group kAhead steps before the end (tiles with fewer k-steps skip it).
// NoStepHook: none.
struct NoStepHook {
  static constexpr int kAhead = 0;
  MB_DEV void operator()() const {}
};

// The consumers' part of one tile: wgmma over the tile's k stages as they are published,
// one group in flight, every buffer handed back (the tile's last one too, for the next
// tile's fill). Starts with a consumer barrier, so shared memory the epilogue reads and
// other consumers wrote before the mainloop (down_dgrad's gates) is visible after it.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class Hook = NoStepHook>
MB_DEV void ws_consume(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], int k_size, bf16_t* smem_raw,
                       WsPipe<Cfg>& pipe, const Hook& hook = {}) {
  constexpr int S = Cfg::STAGES;
  const unsigned smem_at = smem_addr(align_1024(smem_raw));
  const int k_tiles = (k_size + Cfg::BK - 1) / Cfg::BK;
  const int base = pipe.it, end = base + k_tiles;
  consumer_sync<Cfg>();
  zero_accumulators(acc);
  const int warpgroup = consumer_tid<Cfg>() / 128, lane = threadIdx.x & 31;
  // Ping-pong: the groups' mainloops take turns (the other group is in its epilogue meanwhile);
  // a group hands the turn over once it has issued its tile's last k step.
  if constexpr (Cfg::PINGPONG) bar_sync(kOrderBarrier + consumer_group<Cfg>(), 2 * Cfg::THREADS);
  StageCursor<S> c(base);
  int previous = -1;  // the stage buffer of step it-1 within this tile
  for (int it = base; it < end; ++it, c.advance()) {
    mbar_wait(pipe.full_at(c.stage), c.parity);
    if constexpr (Cfg::DIRECT_ARRIVE) fence_proxy_async_smem();  // the producer's cp.async writes, for wgmma
    issue_stage<Cfg, A_KMAJOR, B_KMAJOR>(acc, smem_at + 2u * static_cast<unsigned>(c.stage * Cfg::STAGE_ELEMS), warpgroup);
    if constexpr (Hook::kAhead > 0)
      if (it + Hook::kAhead == end) hook();
    wgmma_wait<1>();  // the group of step it-1 has completed: hand its buffer back
    if (previous >= 0 && lane == 0) release_stage<Cfg>(pipe.empty_at(previous));
    previous = c.stage;
  }
  if constexpr (Cfg::PINGPONG) bar_arrive(kOrderBarrier + (consumer_group<Cfg>() ^ 1), 2 * Cfg::THREADS);
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (previous >= 0 && lane == 0) release_stage<Cfg>(pipe.empty_at(previous));
  pipe.it = end;
}

template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc, class Role, class Hook = NoStepHook>
MB_DEV void ws_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a_src, const BSrc& b_src,
                        int k_size, bf16_t* smem, WsPipe<Cfg>& pipe, Role, const Hook& hook = {}) {
  static_assert(Cfg::WARPS_N == 1 && Cfg::WTM == 16 * Cfg::MT && Cfg::WARPS_M % 4 == 0 &&
                    Cfg::BM == (Cfg::WARPS_M / 4) * Cfg::MT * 64,
                "wgmma tiles: each consumer warpgroup owns MT whole m64 slabs, one 16-row slab per warp in each");
  static_assert(Cfg::BM % 64 == 0 && Cfg::BK == 64, "wgmma tiles: whole warpgroups, 64-wide k");
  static_assert(B_KMAJOR || Cfg::NB == 1, "stacked B tiles are K-major");
  if constexpr (Role::kLoads && Role::kComputes) {  // a one-tile block split here (router GEMMs)
    if (!is_consumer<Cfg>()) ws_produce<Cfg, A_KMAJOR, B_KMAJOR>(a_src, b_src, k_size, smem, pipe);
    else ws_consume<Cfg, A_KMAJOR, B_KMAJOR>(acc, k_size, smem, pipe, hook);
    __syncthreads();
  } else if constexpr (Role::kLoads) {
    ws_produce<Cfg, A_KMAJOR, B_KMAJOR>(a_src, b_src, k_size, smem, pipe);
  } else if constexpr (Role::kComputes) {
    ws_consume<Cfg, A_KMAJOR, B_KMAJOR>(acc, k_size, smem, pipe, hook);
  } else {  // a ping-pong group passing over the other group's tile: its k steps, uncounted here
    pipe.it += (k_size + Cfg::BK - 1) / Cfg::BK;
  }
}

}  // namespace moeblaze::gemm
