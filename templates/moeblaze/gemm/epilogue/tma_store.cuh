// TMA-store epilogue (tiles with Tile::TMA_STORE, the "_tmastore" suffix): the consumers write the
// bf16 output tile into a staging buffer after the pipeline stages and move on to the next
// tile's mainloop while one thread's cp.async.bulk.tensor stores drain it to global memory.
// With the direct epilogue (4-byte stores from the accumulator registers) the tensor cores
// wait for every store of every tile; on short tiles (the weight gradients of many-expert
// layers: 8 k-steps per 128x256 tile on deepseek-v3) that wait is a large part of the tile.
//
// Staging layout (gemm/epilogue/out_stage.cuh): BN/64 blocks of [BM rows][64 columns] in the 128-byte
// swizzle, which is what a [BM][64] box of a CU_TENSOR_MAP_SWIZZLE_128B map reads. A warp's
// 4-byte writes (8 rows x 4 pairs of one chunk column) fall in 32 different banks.
//
// Output maps are 3-D, [experts][rows][cols] (runtime/tma.cpp encode_output_map), box
// [1][BM][64]: rows past an expert's last and columns past the last are out of range, and a
// TMA store writes nothing there, so partial tiles need no masks. A tile that straddles two
// output matrices (gate_up_wgrad's dW1 | dW3 when n % BM != 0) keeps the direct stores: a TMA
// store at a negative coordinate (its dW3 part, rows before dW3's first) is an illegal
// instruction on the H200, unlike boxes that run past the far edges, which are clipped.
//
// Ordering: before overwriting the buffer, the issuing thread waits until its previous
// stores have read it (wait_group.read) and the consumers sync; after writing, every writer
// fences its writes into the async proxy and the consumers sync before the issue. A block
// waits for its stores to complete before it exits (tma_store_drain).
#pragma once
#include "moeblaze/gemm/epilogue/out_stage.cuh"
#include "moeblaze/gemm/mainloop/warp_specialized.cuh"
#include "moeblaze/ptx/tma.cuh"

namespace moeblaze::gemm {

// The staging buffer of this thread's consumer group (ping-pong groups each have one).
template <class Cfg>
MB_DEV bf16_t* staging_buffer() {
  return align_1024(dynamic_smem()) + Cfg::STAGES * Cfg::STAGE_ELEMS + consumer_group<Cfg>() * Cfg::OUT_GROUP_ELEMS;
}

// Where a staged tile goes: its first row and column in one expert's matrix of the map.
struct StoreTarget {
  const TmaMap* map;
  int row, col, expert;
};

// Consumers only (one tile's consumer group): stage the accumulator tile as bf16 and issue its
// stores (thread 0), or with `add` its reductions into what the target already holds (bf16
// gradient accumulation: the read-add-write happens in L2, off the consumers' path, where a
// register epilogue waits a memory round trip per element pair). Returns with the stores in
// flight on persistent tiles; one-tile blocks wait for them here.
template <class Cfg>
MB_DEV void tma_store_tile(const float (&acc)[1][Cfg::MT][Cfg::NT][4], const StoreTarget& to, bool add = false) {
  static_assert(Cfg::TMA_STORE && Cfg::NB == 1, "TMA-store tiles have one B tile");
  bf16_t* out = staging_buffer<Cfg>();
  const bool issuer = consumer_tid<Cfg>() == 0;
  if constexpr (Cfg::STORE_BLOCKS) {
    // 64 columns at a time, one commit group each, in the two [BM][64] buffers in turn: block j
    // reuses the buffer of block j - 2 (of this tile or the previous one), whose group is no
    // longer the newest, so waiting until only the newest may still read frees it. With an odd
    // number of blocks a tile (bn 64 or 192) the first block reuses the buffer of the previous
    // tile's last, the newest group: it waits for every read.
#pragma unroll
    for (int j = 0; j < Cfg::BN / 64; ++j) {
      bf16_t* block = out + (j & 1) * Cfg::BM * 64;
      if (issuer) {
        if ((Cfg::BN / 64) % 2 == 1 && j == 0) bulk_wait_read_all();
        else bulk_wait_read_all_but_newest();
      }
      consumer_sync<Cfg>();
      for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
        if ((c >> 6) == j) store_bf16x2(block + staged_offset<Cfg::BM>(r, c & 63), v0, v1);
      });
      fence_proxy_async_smem();
      consumer_sync<Cfg>();
      if (issuer) {
        if (add) tma_reduce_add_3d(to.map, block, to.col + 64 * j, to.row, to.expert);
        else tma_store_3d(to.map, block, to.col + 64 * j, to.row, to.expert);
        bulk_commit();
      }
    }
    if constexpr (!Cfg::PERSISTENT)
      if (issuer) bulk_wait_all();
    return;
  }
  if (issuer) bulk_wait_read_all();  // the previous tile's stores have read the buffer
  consumer_sync<Cfg>();
  for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
    store_bf16x2(out + staged_offset<Cfg::BM>(r, c), v0, v1);
  });
  fence_proxy_async_smem();  // this thread's writes, visible to the TMA unit (async proxy)
  consumer_sync<Cfg>();
  if (issuer) {
#pragma unroll
    for (int j = 0; j < Cfg::BN / 64; ++j) {
      if (add) tma_reduce_add_3d(to.map, out + j * Cfg::BM * 64, to.col + 64 * j, to.row, to.expert);
      else tma_store_3d(to.map, out + j * Cfg::BM * 64, to.col + 64 * j, to.row, to.expert);
    }
    bulk_commit();
    if constexpr (!Cfg::PERSISTENT) bulk_wait_all();
  }
}

// An fp32 main gradient goes through the TMA epilogue in [64 rows][BN or 64 columns] pieces,
// which the bf16 staging holds when the tile has 128 rows or more: a whole-tile buffer holds a
// 64-row slab, each 64-column buffer a [64][64] chunk. Other tiles keep the register epilogue
// (gemm/epilogue/wgrad_store.cuh). The host encodes the maps by the same rule
// (runtime/tma.cpp f32_tma_epilogue).
template <class Cfg>
MB_DEV constexpr bool f32_slabs_fit() {
  return Cfg::BM >= 128;
}

// Whether a TMA-store tile (Tile::TMA_STORE) writes this GradOutput through its staged TMA
// epilogue: bf16 gradients, stored or reduce-added, and fp32 main gradients where the slabs fit.
template <class Cfg>
MB_DEV bool tma_epilogue(int grad_output) {
  return grad_output != static_cast<int>(GradOutput::add_f32) || f32_slabs_fit<Cfg>();
}

// Consumers only: add the accumulator tile into an fp32 main gradient by TMA reduce-add. An fp32
// tile is twice the bf16 staging buffer, so it goes 64 rows at a time (a slab: one cooperative
// warpgroup's rows), each slab staged once the previous one's reductions have read the buffer.
template <class Cfg>
MB_DEV void tma_add_tile_f32(const float (&acc)[1][Cfg::MT][Cfg::NT][4], const StoreTarget& to) {
  static_assert(Cfg::TMA_STORE && Cfg::NB == 1 && f32_slabs_fit<Cfg>() && !Cfg::STORE_BLOCKS,
                "an fp32 slab fills a 128-row whole-tile bf16 staging buffer");
  float* out = reinterpret_cast<float*>(staging_buffer<Cfg>());
  const bool issuer = consumer_tid<Cfg>() == 0;
#pragma unroll 1
  for (int slab = 0; slab < Cfg::BM / 64; ++slab) {
    if (issuer) bulk_wait_read_all();  // the previous slab's (or tile's) reductions have read the buffer
    consumer_sync<Cfg>();
    const int r0 = slab * 64;
    for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
      if (r >= r0 && r < r0 + 64)
        *reinterpret_cast<float2*>(out + staged_offset_f32(r - r0, c)) = make_float2(v0, v1);
    });
    fence_proxy_async_smem();
    consumer_sync<Cfg>();
    if (issuer) {
#pragma unroll
      for (int j = 0; j < Cfg::BN / 32; ++j)
        tma_reduce_add_3d(to.map, out + j * 64 * 32, to.col + 32 * j, to.row + r0, to.expert);
      bulk_commit();
    }
  }
  if constexpr (!Cfg::PERSISTENT)
    if (issuer) bulk_wait_all();
}

// Consumers only, 64-column staging (_tmastore64): add the accumulator tile into an fp32 main
// gradient by TMA reduce-add in [64 rows][64 columns] chunks (16 KiB: one [BM][64] bf16 buffer),
// slab by slab, in the two buffers in turn, one commit group a chunk. A 128-row tile has an even
// number of chunks, so chunk i always reuses the buffer of chunk i - 2 (of this tile or the
// previous one), whose group is not the newest: waiting until only the newest may still read
// frees it. Each chunk leaves as two [64][32] boxes of the fp32 map.
template <class Cfg>
MB_DEV void tma_add_blocks_f32(const float (&acc)[1][Cfg::MT][Cfg::NT][4], const StoreTarget& to) {
  static_assert(Cfg::TMA_STORE && Cfg::NB == 1 && Cfg::STORE_BLOCKS && f32_slabs_fit<Cfg>() && Cfg::BM * 64 * 2 == 64 * 64 * 4,
                "an fp32 [64][64] chunk fills one 128-row [BM][64] bf16 buffer");
  static_assert((Cfg::BM / 64) * (Cfg::BN / 64) % 2 == 0, "an even number of chunks a tile keeps the buffers' turns");
  bf16_t* out = staging_buffer<Cfg>();
  const bool issuer = consumer_tid<Cfg>() == 0;
#pragma unroll 1
  for (int slab = 0; slab < Cfg::BM / 64; ++slab) {
    const int r0 = slab * 64;
#pragma unroll
    for (int j = 0; j < Cfg::BN / 64; ++j) {
      const int chunk = slab * (Cfg::BN / 64) + j;
      float* block = reinterpret_cast<float*>(out + (chunk & 1) * Cfg::BM * 64);
      if (issuer) bulk_wait_read_all_but_newest();
      consumer_sync<Cfg>();
      for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
        if (r >= r0 && r < r0 + 64 && (c >> 6) == j)
          *reinterpret_cast<float2*>(block + staged_offset_f32(r - r0, c & 63)) = make_float2(v0, v1);
      });
      fence_proxy_async_smem();
      consumer_sync<Cfg>();
      if (issuer) {
        tma_reduce_add_3d(to.map, block, to.col + 64 * j, to.row + r0, to.expert);
        tma_reduce_add_3d(to.map, block + 64 * 32, to.col + 64 * j + 32, to.row + r0, to.expert);
        bulk_commit();
      }
    }
  }
  if constexpr (!Cfg::PERSISTENT)
    if (issuer) bulk_wait_all();
}

// Consumers only: the weight gradient of a TMA-store tile, by its GradOutput (those that
// tma_epilogue sends this way).
template <class Cfg>
MB_DEV void tma_wgrad_tile(const float (&acc)[1][Cfg::MT][Cfg::NT][4], const StoreTarget& to, int grad_output) {
  if constexpr (f32_slabs_fit<Cfg>()) {
    if (grad_output == static_cast<int>(GradOutput::add_f32)) {
      if constexpr (Cfg::STORE_BLOCKS) tma_add_blocks_f32<Cfg>(acc, to);
      else tma_add_tile_f32<Cfg>(acc, to);
      return;
    }
  }
  tma_store_tile<Cfg>(acc, to, grad_output == static_cast<int>(GradOutput::add_bf16));
}

// A persistent block's last act (its schedule has ended): wait for the stores in flight.
template <class Cfg>
MB_DEV void tma_store_drain() {
  if constexpr (Cfg::TMA_STORE && Cfg::PERSISTENT)
    if (is_consumer<Cfg>() && consumer_tid<Cfg>() == 0) bulk_wait_all();
}

}  // namespace moeblaze::gemm
