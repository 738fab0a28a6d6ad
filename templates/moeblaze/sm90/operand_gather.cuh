// Gathered operands: tile rows picked through an index list (a tile's slots in
// expert_token_indices) from a row-major bf16 tensor, copied 16 bytes at a time by the producer
// warpgroup's kGatherThreads threads with cp.async into the stage's 128-byte-swizzle layout
// (the mainloop arrives on the stage's full barrier when they land). Hopper's TMA cannot gather
// rows (Blackwell's can); QuACK's SM90 gather does the same with four warps.
#pragma once
#include "moeblaze/ptx/cp_async.cuh"
#include "moeblaze/sm90/config.cuh"

namespace moeblaze::sm90 {

constexpr int kGatherThreads = 128;

// Where a copying thread's 16-byte chunks land in a stage (bytes from the stage base; the 128-byte
// swizzle: chunk c of a 128-byte row r sits at chunk c ^ (r % 8)). Host and device code, so that
// tests/layout checks them against CuTe's stage layouts.
// K-major [ROWS][64]: thread ptid's first row ptid / 8, chunk ptid % 8; its i-th row 16 i further.
MB_HD constexpr uint32_t gather_rows_k_offset(int ptid) {
  return static_cast<uint32_t>((ptid / 8) * 128 + (((ptid % 8) ^ ((ptid / 8) % 8)) * 16));
}
// MN-major [64 k][ROWS] as ROWS / 64 blocks of [64][64] (GatherColsMN): thread ptid copies the
// 16-byte chunk ptid % 8 of each block for the k rows ptid / 8 + 16 j, j < 4. Its copy (j, b)
// lands gather_cols_mn_offset(ptid) + j 2048 + b 8192 bytes from the stage base: the 128-byte
// swizzle XORs the chunk with the k row modulo 8, the same for all four rows.
MB_HD constexpr uint32_t gather_cols_mn_offset(int ptid) {
  const int chunk = ptid % 8, kk = ptid / 8;
  return static_cast<uint32_t>(kk * 128 + ((chunk ^ (kk % 8)) * 16));
}
// Its four rows' indices: each lane loads the index of k row gather_cols_mn_index_row(ptid) of
// a step, and takes row j's from lane gather_cols_mn_row_lane(ptid, j) of its warp (the eight
// lanes of a k-row group share their rows).
MB_HD constexpr int gather_cols_mn_index_row(int ptid) { return ptid / 8 + 16 * (ptid % 4); }
MB_HD constexpr int gather_cols_mn_row_lane(int ptid, int j) { return (ptid % 32) - ptid % 8 + j; }

// K-major: tile row r < rows is row idx[r] of `base` (rows ld elements apart), k columns
// [64 k, +64); rows at or past `rows` and columns at or past `limit` are zero-filled and read
// nothing. Each thread copies one 16-byte column chunk of ROWS / 16 rows, 16 apart: the
// 128-byte swizzle repeats every 8 rows of 128 bytes, so the chunk's swizzled position is the
// same in all of them and each copy lands at a constant offset from the stage base. A thread
// keeps its rows' indices (32-bit: one IMAD.WIDE a copy makes the address; 64-bit row pointers
// spilled the producer's 40 registers). A tile's rows that exist are a prefix, so it keeps only
// how many of its own do: one compare a copy and no address select (QuACK's gather).
struct GatherRowsK {
  static constexpr Major MAJOR = Major::k;
  static constexpr bool GATHERED = true;
  const Element* base;
  const int* idx;
  int rows;
  int ld;
  int limit;

  template <int ROWS>
  struct ThreadCopy {
    static constexpr int PER = ROWS / 16;
    int row[PER];    // the thread's rows of `base` (a missing row: 0, never read)
    int exist;       // how many of them exist
    uint32_t dst;    // byte offset of its first copy in a stage
    int col;
  };

  template <int ROWS>
  MB_DEV ThreadCopy<ROWS> thread_copy(int ptid) const {
    static_assert(ROWS % 16 == 0 && ROWS * 8 % kGatherThreads == 0, "16-byte chunks split evenly over the threads");
    ThreadCopy<ROWS> c;
    const int r0 = ptid / 8, chunk = ptid % 8;
    c.col = chunk * 8;
    c.dst = gather_rows_k_offset(ptid);
    c.exist = 0;
    CUTE_UNROLL
    for (int i = 0; i < ThreadCopy<ROWS>::PER; ++i) {
      const int r = r0 + 16 * i;
      const bool ok = r < rows;
      c.row[i] = ok ? idx[r] : 0;
      if (ok) c.exist = i + 1;
    }
    return c;
  }

  // k step k's copies into the stage at shared-window address `stage`.
  template <int ROWS>
  MB_DEV void copy(ThreadCopy<ROWS>& c, int k, uint32_t stage) const {
    const int k0 = k * 64;
    const bool col_ok = k0 + c.col < limit;
    const Element* at = base + (k0 + c.col);
    const uint32_t dst = stage + c.dst;
    CUTE_UNROLL
    for (int i = 0; i < ThreadCopy<ROWS>::PER; ++i)
      cp_async16(dst + i * 2048u, at + static_cast<i64>(c.row[i]) * ld, col_ok && i < c.exist);
  }
};

// MN-major, gathered along k (the weight gradients' reduction over an expert's slots): k row kk
// of step k is row idx[64 k + kk] of `base` (a token's row of x or dy) when 64 k + kk < rows, else
// zeros; its columns [col0, +ROWS) form the stage's MN extent (columns at or past `limit`: zeros).
// The stage is ROWS / 64 blocks of [64 k][64] in the 128-byte swizzle.
//
// QuACK's arrangement of the copies: each thread copies one 16-byte chunk position of every
// 64-column block (ROWS / 64 copies a row, at fixed offsets from one address) for four k rows,
// so a step costs a thread four row addresses whatever ROWS is (one chunk column a thread for 16
// rows cost sixteen at 256 columns). The rows change every step, and a step's copies cannot
// issue before its indices are in registers: the indices are loaded AHEAD steps ahead (an index
// load's L2 latency off the producer's path), one load a lane, and reach the eight lanes that
// share them by shuffles.
struct GatherColsMN {
  static constexpr Major MAJOR = Major::mn;
  static constexpr bool GATHERED = true;
  const Element* base;
  const int* idx;  // the expert's slots' tokens
  int rows;        // the expert's slots
  int ld;
  int col0, limit;

  template <int ROWS>
  struct ThreadCopy {
    static constexpr int BLOCKS = ROWS / 64;  // 64-column blocks: copies a row
    static constexpr int ROWS_PER = 4;        // k rows a thread copies a step (16 apart)
    static constexpr int AHEAD = 3;           // steps whose indices are loaded (or in flight)
    int ahead[AHEAD];   // the lane's index of steps k, k + 1, ... (-1: past the expert's slots)
    int lane_k_row;     // the k row (within a step) whose index the lane loads
    int group_lane0;    // the first lane of its k-row group
    uint32_t dst;       // byte offset of its first copy in a stage
    const char* at;     // base + its column (bytes: a row's address is one IMAD.WIDE)
    bool col_ok[BLOCKS];
    bool all_cols;      // every block inside the columns (the same for the tile's threads)
  };

  // The lane's index of step k (a load that only issues: the value is used AHEAD steps later).
  template <int ROWS>
  MB_DEV int lane_index(const ThreadCopy<ROWS>& c, int k) const {
    const int r = 64 * k + c.lane_k_row;
    return r < rows ? idx[r] : -1;
  }

  template <int ROWS>
  MB_DEV ThreadCopy<ROWS> thread_copy(int ptid) const {
    using C = ThreadCopy<ROWS>;
    static_assert(ROWS % 64 == 0 && kGatherThreads == 128, "whole 64-column blocks; 16 k-row groups of 8 threads");
    C c;
    const int col = (ptid % 8) * 8;
    c.lane_k_row = gather_cols_mn_index_row(ptid);
    c.group_lane0 = gather_cols_mn_row_lane(ptid, 0);
    c.dst = gather_cols_mn_offset(ptid);
    CUTE_UNROLL
    for (int b = 0; b < C::BLOCKS; ++b) c.col_ok[b] = col0 + b * 64 + col < limit;
    c.all_cols = col0 + ROWS <= limit;
    c.at = reinterpret_cast<const char*>(base + (col0 + col));
    // Opaque to the compiler, which otherwise splits each address back into the kernel
    // argument's base plus (row ld + column) 2: three instructions a row instead of one.
    asm volatile("mov.b64 %0, %0;\n" : "+l"(c.at));
    CUTE_UNROLL
    for (int a = 0; a < C::AHEAD; ++a) c.ahead[a] = lane_index(c, a);
    return c;
  }

  // Step k's copies; steps come in order from 0 (the mainloop's k loop over one tile).
  template <int ROWS>
  MB_DEV void copy(ThreadCopy<ROWS>& c, int k, uint32_t stage) const {
    using C = ThreadCopy<ROWS>;
    // A missing row (-1) zero-fills: its address is formed but never read. So do chunks past
    // the columns; a tile inside them (all but a last column tile) tests its rows alone.
    auto rows_copy = [&](auto col_ok) {
      CUTE_UNROLL
      for (int j = 0; j < C::ROWS_PER; ++j) {
        const int row = __shfl_sync(0xffffffffu, c.ahead[0], c.group_lane0 + j);  // gather_cols_mn_row_lane
        const char* src = c.at + static_cast<i64>(row) * (2 * ld);
        CUTE_UNROLL
        for (int b = 0; b < C::BLOCKS; ++b)
          cp_async16_unless_negative(stage + c.dst + j * 2048u + b * 8192u, src + b * 128, col_ok(b) ? row : -1);
      }
    };
    if (c.all_cols) rows_copy([](int) { return true; });
    else rows_copy([&](int b) { return c.col_ok[b]; });
    CUTE_UNROLL
    for (int a = 0; a + 1 < C::AHEAD; ++a) c.ahead[a] = c.ahead[a + 1];
    c.ahead[C::AHEAD - 1] = lane_index(c, k + C::AHEAD);
  }
};

}  // namespace moeblaze::sm90
