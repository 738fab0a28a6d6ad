// Which 16-byte chunks of an MN-major stage tile ([ROWS k][COLS], blocked 128-byte swizzle)
// each loader thread copies. Host and device code: tests/cpu/test_mn_map.cpp checks it on the
// host, MnMajorLoader (gemm/loaders.cuh) uses it.
//
// Eight consecutive threads copy the eight chunks of one 128-byte line (one row of one
// 64-column block), so a warp-wide copy reads four whole lines: the fewest lines a 512-byte
// copy can touch (a loader that spread a warp copy over 16 lines lost up to 50% on the
// K-major tiles, docs/performance.md "Decisions"). A thread copies the same
// chunk of each of the row's G = COLS/64 blocks, so one row pointer, and for a gathered stage
// one row index, serves G copies: 4 indices per thread and stage on a [64][256] tile with a
// 128-thread producer instead of 16.
#pragma once
#include "moeblaze/common.cuh"

namespace moeblaze::gemm {

template <int ROWS, int COLS, int THREADS>
struct MnRowMap {
  static_assert(COLS % 64 == 0, "MN-major tiles are 64-column blocks");
  static_assert(THREADS % 8 == 0, "eight threads per 128-byte line");
  static constexpr int G = COLS / 64;           // chunks per row and thread, one per block
  static constexpr int ROW_STEP = THREADS / 8;  // rows between a thread's rows
  static_assert(ROWS % ROW_STEP == 0, "rows split evenly among the threads");
  static constexpr int R = ROWS / ROW_STEP;  // rows per thread
  MB_HD static constexpr int row(int tid, int i) { return tid / 8 + i * ROW_STEP; }
  MB_HD static constexpr int col(int tid, int j) { return (tid % 8) * 8 + j * 64; }
  // Element offset of (row, col) in the blocked swizzled tile (device.cuh swizzle_blocked).
  MB_HD static constexpr int offset(int r, int c) {
    return (c >> 6) * (ROWS * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
  }
};

}  // namespace moeblaze::gemm
