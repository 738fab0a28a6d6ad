// MoEBlaze index build (docs/design.md "Index arrays"), O(T*K), no atomics and no sort:
//   1. count:   each warp counts its run of slots per expert (warp match + popcount,
//               one leader lane per expert updates the warp's private counter row);
//   2. scan:    one block turns the per-(expert, block) counts into offsets, the expert
//               offsets, the per-expert statistics and the GEMM tile schedules;
//   3. scatter: each warp replays its slots in the same order and writes every slot's
//               final position. Slot order is token-major, so tokens ascend inside an expert.
// The result depends only on topk_ids: forward and backward are bitwise reproducible.
#pragma once
#include "moeblaze/device.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::index_build {

constexpr int WARPS = 8;
constexpr int SLOTS_PER_WARP = 256;
constexpr int SLOTS_PER_BLOCK = WARPS * SLOTS_PER_WARP;

// Expert of a slot, or -1 for a slot past the end or a bad id (reported in the status
// word when `report`; the slot is then left out: kLeftOutSlot in the token-major arrays).
// A token that picks one expert twice is reported too, but both slots are kept: each is a
// slot of its own, and its readers find it by position (slot_gate.cuh).
template <int E, int K>
MB_DEV int slot_expert(const IndexBuildArgs& p, i64 slot, bool report) {
  if (slot >= p.tokens * K) return -1;
  const int e = p.topk_ids[slot];
  if (e < 0 || e >= E) {
    if (report) *p.status = routing_id_out_of_range;
    return -1;
  }
  if (report) {
    const i64 first = slot - slot % K;
    for (i64 s = first; s < slot; ++s)
      if (p.topk_ids[s] == e) *p.status = routing_duplicate_expert;
  }
  return e;
}

// Per-warp expert counts of this block's slots into cnt[WARPS][E].
template <int E, int K>
MB_DEV void count_warp_runs(const IndexBuildArgs& p, int (*cnt)[E], bool report) {
  for (int i = threadIdx.x; i < WARPS * E; i += blockDim.x) cnt[i / E][i % E] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 begin = (static_cast<i64>(blockIdx.x) * WARPS + warp) * SLOTS_PER_WARP;
  for (int g = 0; g < SLOTS_PER_WARP; g += 32) {
    const int e = slot_expert<E, K>(p, begin + g + lane, report);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) cnt[warp][e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
}

template <int E, int K>
MB_DEV void count(const IndexBuildArgs& p) {
  __shared__ int cnt[WARPS][E];
  count_warp_runs<E, K>(p, cnt, true);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int s = 0;
    for (int w = 0; w < WARPS; ++w) s += cnt[w][e];
    p.block_counts[static_cast<i64>(blockIdx.x) * E + e] = s;
  }
}

// Exclusive scan of v over lanes of one warp; returns the warp total.
MB_DEV int warp_exclusive_scan(int& v) {
  const int lane = threadIdx.x & 31;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  const int total = __shfl_sync(0xffffffffu, x, 31);
  v = x - v;
  return total;
}

// One block. Per expert: its count; then expert offsets, statistics and the tile prefix sums
// (BM = 64, 128, 256) that the grouped GEMMs schedule with; then each count block's offset,
// written once. The per-block counts are block-major ([blocks][E]), so a warp's loads of one
// block's row are one coalesced line: the expert-major layout made each of them 32 sectors and
// the scan a fifth of the index build on E = 512.
template <int E, int K>
MB_DEV void scan(const IndexBuildArgs& p) {
  __shared__ int counts[E];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = 0;
#pragma unroll 8
    for (int b = 0; b < p.blocks; ++b) run += p.block_counts[static_cast<i64>(b) * E + e];
    counts[e] = run;
    p.expert_counts[e] = run;
  }
  __syncthreads();
  __shared__ int expert_base[E];
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int carry = 0, carry_t[kTilePrefixRows] = {0, 0, 0};
    for (int c0 = 0; c0 < E; c0 += 32) {
      const int e = c0 + lane;
      const int n = e < E ? counts[e] : 0;
      int v = n;
      const int total = warp_exclusive_scan(v);
      if (e < E) {
        expert_base[e] = carry + v;
        p.expert_token_offsets[e] = carry + v;
      }
      carry += total;
#pragma unroll
      for (int row = 0; row < kTilePrefixRows; ++row) {
        const int bm = 64 << row;
        int tv = (n + bm - 1) / bm;
        const int tt = warp_exclusive_scan(tv);
        if (e < E) p.tile_prefix[row * (E + 1) + e] = carry_t[row] + tv;
        carry_t[row] += tt;
      }
    }
    if (lane == 0) {
      p.expert_token_offsets[E] = carry;
#pragma unroll
      for (int row = 0; row < kTilePrefixRows; ++row) p.tile_prefix[row * (E + 1) + E] = carry_t[row];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = expert_base[e];
#pragma unroll 8
    for (int b = 0; b < p.blocks; ++b) {
      const i64 i = static_cast<i64>(b) * E + e;
      const int c = p.block_counts[i];
      p.block_offsets[i] = run;
      run += c;
    }
  }
}

template <int E, int K>
MB_DEV void scatter(const IndexBuildArgs& p) {
  __shared__ int base[WARPS][E];
  count_warp_runs<E, K>(p, base, false);
  // Counts -> this warp's first position per expert.
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = p.block_offsets[static_cast<i64>(blockIdx.x) * E + e];
    for (int w = 0; w < WARPS; ++w) {
      const int c = base[w][e];
      base[w][e] = run;
      run += c;
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 begin = (static_cast<i64>(blockIdx.x) * WARPS + warp) * SLOTS_PER_WARP;
  const i64 total = p.tokens * K;
  for (int g = 0; g < SLOTS_PER_WARP; g += 32) {
    const i64 slot = begin + g + lane;
    const int e = slot_expert<E, K>(p, slot, false);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0) {
      const int pos = base[warp][e] + rank;
      p.expert_token_indices[pos] = static_cast<int>(slot / K);
      p.token_index_map[slot] = pos;
      p.token_expert_indices[slot] = e;
    } else if (slot < total) {  // bad id, already reported: every reader skips the slot
      p.token_index_map[slot] = kLeftOutSlot;
      p.token_expert_indices[slot] = kLeftOutSlot;
    }
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) base[warp][e] += __popc(peers);
    __syncwarp();
  }
}

}  // namespace moeblaze::index_build
