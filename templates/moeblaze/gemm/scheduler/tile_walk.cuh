// How a block walks its tiles (gemm::for_each_tile) and which of its threads run a tile body:
// one-tile or persistent grids; one role, or a warp-specialised block's producer and consumers,
// each with the register budget of its own (setmaxnreg).
#pragma once
#include "moeblaze/gemm/mainloop/warp_specialized.cuh"
#include "moeblaze/gemm/scheduler/tile_schedule.cuh"
#include "moeblaze/ptx/cluster.cuh"
#include "moeblaze/ptx/warpgroup.cuh"

namespace moeblaze::gemm {

// Which threads run a tile body (for_each_tile): all of them (one-role blocks), or, in a
// warp-specialised block, the producer warpgroup or the consumer warpgroups, each with code
// of its own so that setmaxnreg can move registers from the producer to the consumers.
// kConsumer: the threads hold accumulators at all (what a body's end of schedule drains).
struct AllThreads {
  static constexpr bool kLoads = true, kComputes = true, kConsumer = true;
};
struct ProducerThreads {
  static constexpr bool kLoads = true, kComputes = false, kConsumer = false;
};
struct ConsumerThreads {
  static constexpr bool kLoads = false, kComputes = true, kConsumer = true;
};
// A ping-pong consumer group on a tile the other group owns: it only counts the tile's k steps,
// so that its view of the block's stage sequence stays in step with the producer's.
struct PassingThreads {
  static constexpr bool kLoads = false, kComputes = false, kConsumer = true;
};

// Register budget of the two roles after setmaxnreg (launch: 384 threads x 168): the producer
// keeps its loaders' row pointers and keys, the consumers hold up to 128 accumulators plus the
// epilogue; 128 x 96 + 256 x 200 <= 384 x 168. Of the splits tried on the suite shapes
// (72/216, 80/208, 88/208, 96/200, 104/200) this one spills nowhere but in gate_up's 128x128
// NB=2 tile (8-44 bytes); the producer spills below 96.
constexpr int kProducerRegs = 96, kConsumerRegs = 200;
// Tiles whose consumers hold more than 160 accumulators a thread (a ping-pong warpgroup's whole
// 128 x 192 tile: 192) move more registers to the consumers: 128 x 56 + 256 x 224 = 384 x 168.
// On gate_up's 128 x (2 x 96) ping-pong tile, CUTLASS's 40 / 232 spilled 56-80 bytes (the
// gathered producer's row pointers) and 72 / 216 spilled 1952 bytes (the consumers); 56 / 224
// spills nowhere on the suite shapes.
constexpr int kLeanProducerRegs = 56, kWideConsumerRegs = 224;
template <class Cfg>
struct RegisterSplit {
  static constexpr int ACC = Cfg::NB * Cfg::MT * Cfg::NT * 4;
  static constexpr bool WIDE = ACC > 160;
  static constexpr int PRODUCER = WIDE ? kLeanProducerRegs : kProducerRegs;
  static constexpr int CONSUMER = WIDE ? kWideConsumerRegs : kConsumerRegs;
};

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
// - Ping-pong blocks: the two consumer groups take the block's tiles in turn (group g the
//   block's tiles g, g + 2, ...), both walking every tile so that each knows where its tiles'
//   k steps sit in the producer's stage sequence. Group 1 first hands group 0 the mainloop
//   turn (ws_consume passes it back and forth).
template <class Cfg, class Body>
MB_DEV void for_each_tile(Body&& body) {
  PipeOf<Cfg> pipe = make_pipe<Cfg>();
  // A cluster pair walks the schedule as one: tile i of the pair is its blocks' halves. (Read
  // from the special registers where used, not held in registers across the tile bodies.)
  auto first = [] { return static_cast<int>(blockIdx.x) / Cfg::CLUSTER; };
  auto stride = [] { return static_cast<int>(gridDim.x) / Cfg::CLUSTER; };
  auto walk = [&](auto role) {
    if constexpr (Cfg::PERSISTENT) {
      for (int tile = first(); body(tile, pipe, role); tile += stride()) {
      }
    } else {
      body(static_cast<int>(blockIdx.x), pipe, role);
    }
  };
  if constexpr (Cfg::PINGPONG) {
    if (!is_consumer<Cfg>()) {
      setmaxnreg_dec<RegisterSplit<Cfg>::PRODUCER>();
      walk(ProducerThreads{});
    } else {
      setmaxnreg_inc<RegisterSplit<Cfg>::CONSUMER>();
      const int group = consumer_group<Cfg>();
      if (group == 1) bar_arrive(kOrderBarrier + 0, 2 * Cfg::THREADS);
      for (int i = 0, tile = first();; ++i, tile += stride()) {
        const bool more = (i & 1) == group ? body(tile, pipe, ConsumerThreads{}) : body(tile, pipe, PassingThreads{});
        if (!more) break;
      }
    }
  } else if constexpr (Cfg::WARP_SPECIALIZED) {
    if (threadIdx.x >= Cfg::THREADS) {
      setmaxnreg_dec<RegisterSplit<Cfg>::PRODUCER>();
      walk(ProducerThreads{});
    } else {
      setmaxnreg_inc<RegisterSplit<Cfg>::CONSUMER>();
      walk(ConsumerThreads{});
    }
  } else {
    walk(AllThreads{});
  }
  // Neither block of a pair leaves while the other may still write its shared memory or arrive
  // on its barriers.
  if constexpr (Cfg::CLUSTER > 1) cluster_sync();
}

// The rows of a cluster pair's 2*BM-row slot tile that this block computes: rank r takes rows
// [r*BM, r*BM + BM). A block whose half is empty (an expert's last, odd tile) still loads its
// half of the shared operand for its partner and computes nothing it stores.
template <class Cfg>
MB_DEV SlotTile cluster_half(SlotTile t) {
  if constexpr (Cfg::CLUSTER > 1) {
    const int off = static_cast<int>(cluster_ctarank()) * Cfg::BM;
    const int rows = t.rows - off;
    t.slot0 += off;
    t.rows = rows < 0 ? 0 : rows > Cfg::BM ? Cfg::BM : rows;
  }
  return t;
}

}  // namespace moeblaze::gemm
