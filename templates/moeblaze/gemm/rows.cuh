// Row sources for the GEMM mainloop (see mainloop.cuh): how a tile row maps to memory.
// This is where gathers are fused: a row is either base + r*ld (contiguous) or
// base + idx[r]*ld (gathered through expert_token_indices).
#pragma once
#include "moeblaze/gemm/tile.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::gemm {

struct Rows {
  const bf16_t* base;
  const int* idx;  // nullptr: contiguous rows
  int count;       // rows [0, count) exist
  i64 ld;          // elements between rows
  int limit;       // valid columns (see mainloop.cuh)
  MB_DEV const bf16_t* row(int r) const {
    if (r >= count) return nullptr;
    return base + (idx ? static_cast<i64>(idx[r]) : static_cast<i64>(r)) * ld;
  }
  MB_DEV const bf16_t* fallback() const { return base; }
  static constexpr bool kMayGather = true;
  // Whether rows [r0, r0 + n) all exist and are evenly spaced ld apart from row(r0): a
  // stage of such rows loads as one pointer plus a stride (TileLoader, MnMajorLoader).
  MB_DEV bool contiguous(int r0, int n) const { return idx == nullptr && r0 + n <= count; }
  // row(r) in two steps, so a gathered index can be loaded early and used later.
  MB_DEV int key(int r) const { return r < count ? (idx ? idx[r] : r) : -1; }
  MB_DEV const bf16_t* at(int key) const { return base + static_cast<i64>(key) * ld; }
};

// Rows [0, split) from base0, rows [split, count) from base1 (row r at base1 + (r-split)*ld).
// Stacks W1 on W3 along n (up forward, split = BN) or along k (up dgrad, split = n).
struct TwoPartRows {
  const bf16_t* base0;
  const bf16_t* base1;
  int split;
  int count0, count1;  // valid rows in each part
  i64 ld;
  int limit;
  MB_DEV const bf16_t* row(int r) const {
    if (r < split) return r < count0 ? base0 + static_cast<i64>(r) * ld : nullptr;
    r -= split;
    return r < count1 ? base1 + static_cast<i64>(r) * ld : nullptr;
  }
  // Rows [r0, r0 + n) all exist inside one part (see Rows::contiguous).
  MB_DEV bool contiguous(int r0, int n) const {
    return r0 + n <= split ? r0 + n <= count0 : r0 >= split && r0 + n - split <= count1;
  }
  MB_DEV const bf16_t* fallback() const { return base0; }
  // Never gathered: its MN-major tiles load through TileLoader directly (StageLoader).
  static constexpr bool kMayGather = false;
};

}  // namespace moeblaze::gemm
