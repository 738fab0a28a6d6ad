// A [BM][BN] bf16 tile in shared memory for epilogues that read and write global memory in
// whole 16-byte chunks (coalesced) while the per-thread math stays in the accumulator
// fragment layout. Chunks are XOR-swizzled by (row & 7), so a warp's fragment access (8 rows x
// 16 bytes) lands in 8 distinct bank groups.
#pragma once
#include "moeblaze/device.cuh"

namespace moeblaze::gemm {

template <int BM, int BN>
struct StagedTile {
  static_assert(BN % 64 == 0, "the swizzle permutes chunks inside groups of 8");
  static constexpr int CHUNKS_PER_ROW = BN / 8;
  bf16_t* base;
  MB_DEV static int offset(int r, int c) { return r * BN + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7); }
  MB_DEV bf16_t* at(int r, int c) const { return base + offset(r, c); }
  // Rows [0, rows) x columns [0, cols) of the global window at g (rows ld apart) come in by
  // cp.async (the caller commits and waits); the rest of the tile is zero. cols % 8 == 0.
  MB_DEV void load(const bf16_t* g, i64 ld, int rows, int cols, int tid, int threads) const {
    for (int i = tid; i < BM * CHUNKS_PER_ROW; i += threads) {
      const int r = i / CHUNKS_PER_ROW, c = (i % CHUNKS_PER_ROW) * 8;
      const bool ok = r < rows && c < cols;
      cp_async16(at(r, c), ok ? g + r * ld + c : g, ok);
    }
  }
  // Rows [0, rows) x columns [0, cols) go out to the global window at g, 16 bytes a store.
  MB_DEV void store(bf16_t* g, i64 ld, int rows, int cols, int tid, int threads) const {
    for (int i = tid; i < BM * CHUNKS_PER_ROW; i += threads) {
      const int r = i / CHUNKS_PER_ROW, c = (i % CHUNKS_PER_ROW) * 8;
      if (r < rows && c < cols) *reinterpret_cast<uint4*>(g + r * ld + c) = *reinterpret_cast<const uint4*>(at(r, c));
    }
  }
};

}  // namespace moeblaze::gemm
