// Hopper (sm_90a) warp-specialised mainloop: one producer warpgroup fills the stages, the
// consumer warpgroups only issue wgmma. Same shared-memory tile layouts and descriptors as
// wgmma_mainloop.cuh (128-byte swizzle, MN-major operands in 64-column blocks), same
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
// Persistent tiles (Tile WGMMA_ 3): the barriers and the stage counter live across the
// block's tiles (WsPipe), consumers release every stage including a tile's last, and the
// producer starts the next tile's loads while the consumers run the epilogue.
//
// Gathered MN-major operands (the weight-gradient reductions over an expert's slots) read
// their row indices one stage ahead (StageLoader), so the index load latency is off the
// issue path.
#pragma once
#include "moeblaze/gemm/tma.cuh"
#include "moeblaze/gemm/wgmma_mainloop.cuh"

namespace moeblaze::gemm {

// ---- mbarrier vocabulary (PTX ISA "mbarrier"; mbar_t and expect_tx in tma.cuh) ------------

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

// Barrier among the consumer warpgroups only (named barrier 1): epilogues that share data
// through shared memory sync with this, since a persistent block's producer is already on
// the next tile. Blocks without a producer use __syncthreads.
template <class Cfg>
MB_DEV void consumer_sync() {
  if constexpr (Cfg::WARP_SPECIALIZED) asm volatile("bar.sync 1, %0;\n" ::"n"(Cfg::THREADS) : "memory");
  else __syncthreads();
}

// Pipeline of a warp-specialised block: its barriers, initialised once per block, and the
// number of k stages run by the block's earlier tiles (`it`, the same on every thread:
// producer and consumers walk the same tiles). Stage s of the block's i-th k step is i % S,
// and every barrier's phase parity follows from i, so the pipeline runs on across tiles.
template <class Cfg>
struct WsPipe {
  static constexpr int S = Cfg::STAGES;
  mbar_t* bars;  // landed[S], full[S], empty[S]
  int it;
  MB_DEV mbar_t* landed(int s) const { return bars + s; }
  MB_DEV mbar_t* full(int s) const { return bars + S + s; }
  MB_DEV mbar_t* empty(int s) const { return bars + 2 * S + s; }
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
      mbar_init(&bars[2 * S + s], Cfg::THREADS / 32);
    }
  }
  __syncthreads();
  return WsPipe<Cfg>{bars, 0};
}

// Which threads run a tile body (for_each_tile): all of them (one-role blocks), or, in a
// warp-specialised block, the producer warpgroup or the consumer warpgroups, each with code
// of its own so that setmaxnreg can move registers from the producer to the consumers.
struct AllThreads {
  static constexpr bool kLoads = true, kComputes = true;
};
struct ProducerThreads {
  static constexpr bool kLoads = true, kComputes = false;
};
struct ConsumerThreads {
  static constexpr bool kLoads = false, kComputes = true;
};

// Register budget of the two roles after setmaxnreg (launch: 384 threads x 168): the producer
// keeps its loaders' row pointers and keys, the consumers hold up to 128 accumulators plus the
// epilogue; 128 x 96 + 256 x 200 <= 384 x 168. Of the splits tried on the suite shapes
// (72/216, 80/208, 88/208, 96/200, 104/200) this one spills nowhere but in up_proj's 128x128
// NB=2 tile (8-44 bytes); the producer spills below 96.
constexpr int kProducerRegs = 96, kConsumerRegs = 200;
template <int N>
MB_DEV void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
MB_DEV void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// The producer's part of one tile: issue the tile's k stages into free buffers and publish
// each once landed. Returns when the last stage is published; the consumers may still be on
// earlier stages.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc>
MB_DEV void ws_produce(const ASrc& a_src, const BSrc& b_src, int k_size, bf16_t* smem_raw, WsPipe<Cfg>& pipe) {
  constexpr int S = Cfg::STAGES;
  bf16_t* smem = align_1024(smem_raw);
  const int ptid = threadIdx.x - Cfg::THREADS;
  const int k_tiles = (k_size + Cfg::BK - 1) / Cfg::BK;
  const int base = pipe.it, end = base + k_tiles;  // the block's k steps of this tile: [base, end)
  constexpr int A_ROWS = A_KMAJOR ? Cfg::BM : Cfg::BK, A_COLS = A_KMAJOR ? Cfg::BK : Cfg::BM;
  constexpr int B_ROWS = B_KMAJOR ? Cfg::NB * Cfg::BN : Cfg::BK, B_COLS = B_KMAJOR ? Cfg::BK : Cfg::BN;
  // Each operand by TMA (TmaRows / TmaMnRows sources) or by the producer's cp.async copies.
  using ALoad = LoaderFor<A_ROWS, A_COLS, Cfg::PRODUCER_THREADS, A_KMAJOR, ASrc>;
  using BLoad = LoaderFor<B_ROWS, B_COLS, Cfg::PRODUCER_THREADS, B_KMAJOR, BSrc>;
  typename ALoad::type a_load(a_src, ptid);
  typename BLoad::type b_load(b_src, ptid);
  a_load.fetch(0);
  b_load.fetch(0);
  int issued = base, published = base;
  while (published < end) {
    if (issued < end) {
      const int s = issued % S;
      if (issued < S || mbar_test(pipe.empty(s), ((issued / S) & 1) ^ 1)) {
        bf16_t* stage = smem + s * Cfg::STAGE_ELEMS;
        const int k0 = (issued - base) * Cfg::BK;
        // TMA bytes complete on full[s], which also waits for every producer thread's arrival
        // after landed[s] (the cp.async copies): the consumers see both operands.
        load_operand<ALoad::kTma>(a_load, stage, k0, pipe.full(s));
        load_operand<BLoad::kTma>(b_load, stage + Cfg::A_ELEMS, k0, pipe.full(s));
        cp_async_arrive_noinc(pipe.landed(s));
        ++issued;
        a_load.fetch(k0 + Cfg::BK);
        b_load.fetch(k0 + Cfg::BK);
      }
    }
    if (published < issued) {
      const int s = published % S;
      if (mbar_test(pipe.landed(s), (published / S) & 1)) {
        fence_proxy_async_smem();
        mbar_arrive(pipe.full(s));
        ++published;
      }
    }
  }
  pipe.it = end;
}

// The consumers' part of one tile: wgmma over the tile's k stages as they are published,
// one group in flight, every buffer handed back (the tile's last one too, for the next
// tile's fill). Starts with a consumer barrier, so shared memory the epilogue reads and
// other consumers wrote before the mainloop (down_dgrad's gates) is visible after it.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR>
MB_DEV void ws_consume(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], int k_size, bf16_t* smem_raw,
                       WsPipe<Cfg>& pipe) {
  constexpr int S = Cfg::STAGES;
  bf16_t* smem = align_1024(smem_raw);
  const int k_tiles = (k_size + Cfg::BK - 1) / Cfg::BK;
  const int base = pipe.it, end = base + k_tiles;
  consumer_sync<Cfg>();
  zero_accumulators(acc);
  const int warpgroup = threadIdx.x / 128, lane = threadIdx.x & 31;
  for (int it = base; it < end; ++it) {
    const int s = it % S;
    mbar_wait(pipe.full(s), (it / S) & 1);
    issue_stage<Cfg, A_KMAJOR, B_KMAJOR>(acc, smem + s * Cfg::STAGE_ELEMS, warpgroup);
    wgmma_wait<1>();  // the group of step it-1 has completed: hand its buffer back
    if (it > base && lane == 0) mbar_arrive(pipe.empty((it - 1) % S));
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (end > base && lane == 0) mbar_arrive(pipe.empty((end - 1) % S));
  pipe.it = end;
}

template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc, class Role>
MB_DEV void ws_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a_src, const BSrc& b_src,
                        int k_size, bf16_t* smem, WsPipe<Cfg>& pipe, Role) {
  static_assert(Cfg::WARPS_N == 1 && Cfg::WTM == 16 && Cfg::MT == 1, "wgmma tiles: one 16-row slab per warp");
  static_assert(Cfg::BM % 64 == 0 && Cfg::BK == 64, "wgmma tiles: whole warpgroups, 64-wide k");
  static_assert(B_KMAJOR || Cfg::NB == 1, "stacked B tiles are K-major");
  if constexpr (Role::kLoads && Role::kComputes) {  // a one-tile block split here (router GEMMs)
    if (threadIdx.x >= Cfg::THREADS) ws_produce<Cfg, A_KMAJOR, B_KMAJOR>(a_src, b_src, k_size, smem, pipe);
    else ws_consume<Cfg, A_KMAJOR, B_KMAJOR>(acc, k_size, smem, pipe);
    __syncthreads();
  } else if constexpr (Role::kLoads) {
    ws_produce<Cfg, A_KMAJOR, B_KMAJOR>(a_src, b_src, k_size, smem, pipe);
  } else {
    ws_consume<Cfg, A_KMAJOR, B_KMAJOR>(acc, k_size, smem, pipe);
  }
}

// The pipeline state a block's tiles share: WsPipe for warp-specialised tiles, nothing else.
template <class Cfg>
using PipeOf = typename PickType<Cfg::WARP_SPECIALIZED, WsPipe<Cfg>, NoPipe>::type;

template <class Cfg>
MB_DEV PipeOf<Cfg> make_pipe() {
  if constexpr (Cfg::WARP_SPECIALIZED) return make_ws_pipe<Cfg>();
  else return NoPipe{};
}

// The tiles a block computes, body(tile, pipe, role) -> bool (false: `tile` is past the end
// of the schedule). A body loads its tile's operands, calls run_mainloop with the role, and,
// when Role::kComputes, runs its epilogue.
// - One-tile grids: tile blockIdx.x. Persistent tile configs walk blockIdx.x, +gridDim.x, ...
//   (the host caps their grid at the blocks the GPU holds at once) until the body says the
//   schedule ended; tiles are in schedule order, so the blocks in flight share weight tiles.
// - Warp-specialised blocks split here: the producer warpgroup gives registers back
//   (setmaxnreg) and runs the bodies as ProducerThreads (loads only), the consumers take them
//   and run the bodies as ConsumerThreads (mainloop and epilogue). Each role is its own code,
//   which is what lets ptxas give each its own register budget.
template <class Cfg, class Body>
MB_DEV void for_each_tile(Body&& body) {
  PipeOf<Cfg> pipe = make_pipe<Cfg>();
  auto walk = [&](auto role) {
    if constexpr (Cfg::PERSISTENT) {
      for (int tile = blockIdx.x; body(tile, pipe, role); tile += gridDim.x) {
      }
    } else {
      body(static_cast<int>(blockIdx.x), pipe, role);
    }
  };
  if constexpr (Cfg::WARP_SPECIALIZED) {
    if (threadIdx.x >= Cfg::THREADS) {
      setmaxnreg_dec<kProducerRegs>();
      walk(ProducerThreads{});
    } else {
      setmaxnreg_inc<kConsumerRegs>();
      walk(ConsumerThreads{});
    }
  } else {
    walk(AllThreads{});
  }
}

// The mainloop a tile config asks for: mma.sync, wgmma with a cp.async pipeline shared by
// all warps, or warp-specialised wgmma (the role's part of one tile of the block's pipeline).
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc, class Pipe, class Role>
MB_DEV void run_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a, const BSrc& b, int k_size,
                         bf16_t* smem, Pipe& pipe, Role role) {
  if constexpr (Cfg::WARP_SPECIALIZED) {
    ws_mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem, pipe, role);
  } else if constexpr (Cfg::WGMMA) {
    wgmma_mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem);
  } else {
    mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem);
  }
}

// One-tile kernels that do not split roles (the router GEMMs): a pipeline of their own.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc>
MB_DEV void run_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a, const BSrc& b, int k_size,
                         bf16_t* smem) {
  static_assert(!Cfg::PERSISTENT, "persistent tiles walk their tiles with for_each_tile");
  PipeOf<Cfg> pipe = make_pipe<Cfg>();
  run_mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem, pipe, AllThreads{});
}

}  // namespace moeblaze::gemm
