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
// MN-major [64 k][ROWS] as ROWS / 64 blocks of [64][64]: thread ptid's chunk ptid % (ROWS / 8),
// k row ptid / (ROWS / 8) + K_GROUPS v.
template <int ROWS>
MB_HD constexpr uint32_t gather_cols_mn_offset(int ptid, int v) {
  constexpr int CHUNKS = ROWS / 8, K_GROUPS = kGatherThreads / CHUNKS;
  const int chunk = ptid % CHUNKS, kk = ptid / CHUNKS + K_GROUPS * v;
  return static_cast<uint32_t>((chunk / 8) * (64 * 128) + kk * 128 + (((chunk % 8) ^ (kk % 8)) * 16));
}

// The weight gradients' shared row indices (GatherColsMN): thread ptid loads the index of k row
// gather_cols_mn_index_row(ptid) of each step, and takes copy i's row (k row ptid / CHUNKS +
// K_GROUPS i) from lane gather_cols_mn_row_lane(ptid, i) of its warp.
template <int ROWS>
MB_HD constexpr int gather_cols_mn_index_row(int ptid) {
  constexpr int CHUNKS = ROWS / 8, K_GROUPS = kGatherThreads / CHUNKS, PER = 64 / K_GROUPS;
  return ptid / CHUNKS + K_GROUPS * ((ptid % CHUNKS) % PER);
}
template <int ROWS>
MB_HD constexpr int gather_cols_mn_row_lane(int ptid, int i) {
  return (ptid % 32) - ptid % (ROWS / 8) + i;
}

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
// The stage is ROWS / 64 blocks of [64 k][64] in the 128-byte swizzle. Each thread copies one
// 16-byte column chunk of 64 / K_GROUPS k rows, K_GROUPS apart: with K_GROUPS a multiple of 8 the
// chunk's swizzled position is the same in all of them; with 4 (256-wide stages) it alternates
// between two.
//
// The rows change every k step, and a step's copies cannot issue before its indices are in
// registers: loaded one step ahead, an index load's L2 latency (several hundred cycles) paced
// the producer whenever the consumers were waiting on it. So the indices are loaded AHEAD steps
// ahead, and only once per group of threads that share them: the CHUNKS threads of a k-row group
// (a whole warp, a half or a quarter: CHUNKS divides 32) need the same PER rows a step, so lane
// i of the group loads the group's i-th row (modulo PER) and each copy takes its row by a
// shuffle from that lane: one index load a thread a step instead of PER, AHEAD registers.
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
    static constexpr int CHUNKS = ROWS / 8;                   // 16-byte chunks of a k row
    static constexpr int K_GROUPS = kGatherThreads / CHUNKS;  // threads per column chunk
    static constexpr int PER = 64 / K_GROUPS;                 // k rows a thread copies a step
    static constexpr int VARIANTS = K_GROUPS >= 8 ? 1 : 8 / K_GROUPS;  // swizzled positions
    static constexpr int AHEAD = 3;  // steps whose indices are loaded (or in flight): k .. k + 2
    int ahead[AHEAD];  // the lane's row of steps k, k + 1, ... (-1: past the expert's slots)
    int lane_k_row;    // the k row (within a step) whose index the lane loads
    int group_lane0;   // the first lane of its k-row group
    uint32_t dst[VARIANTS];  // byte offsets of its first copies in a stage
    const char* at;          // base + its column (bytes: a copy's address is one IMAD.WIDE)
    bool col_ok;
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
    static_assert(ROWS % 64 == 0 && kGatherThreads % C::CHUNKS == 0 && 64 % C::K_GROUPS == 0 && 8 % C::VARIANTS == 0,
                  "whole 64-column blocks, the chunks split evenly over the threads");
    static_assert(32 % C::CHUNKS == 0 && C::PER <= C::CHUNKS, "a k-row group is lanes of one warp, one per row");
    C c;
    const int chunk = ptid % C::CHUNKS;
    c.lane_k_row = gather_cols_mn_index_row<ROWS>(ptid);
    c.group_lane0 = gather_cols_mn_row_lane<ROWS>(ptid, 0);
    // Block chunk / 8, k row kg + K_GROUPS v, its 16-byte column swizzled by the row modulo 8.
    CUTE_UNROLL
    for (int v = 0; v < C::VARIANTS; ++v) c.dst[v] = gather_cols_mn_offset<ROWS>(ptid, v);
    c.col_ok = col0 + chunk * 8 < limit;
    c.at = reinterpret_cast<const char*>(base + (col0 + chunk * 8));
    // Opaque to the compiler, which otherwise splits each address back into the kernel
    // argument's base plus (row ld + column) 2: three instructions a copy instead of one.
    asm volatile("mov.b64 %0, %0;\n" : "+l"(c.at));
    CUTE_UNROLL
    for (int a = 0; a < C::AHEAD; ++a) c.ahead[a] = lane_index(c, a);
    return c;
  }

  // Step k's copies; steps come in order from 0 (the mainloop's k loop over one tile).
  template <int ROWS>
  MB_DEV void copy(ThreadCopy<ROWS>& c, int k, uint32_t stage) const {
    using C = ThreadCopy<ROWS>;
    CUTE_UNROLL
    for (int i = 0; i < C::PER; ++i) {
      const int row = __shfl_sync(0xffffffffu, c.ahead[0], c.group_lane0 + i);  // gather_cols_mn_row_lane
      // A missing row (-1) zero-fills: its address is formed but never read.
      cp_async16(stage + c.dst[i % C::VARIANTS] + (i / C::VARIANTS) * (C::K_GROUPS * C::VARIANTS * 128u),
                 c.at + static_cast<i64>(row) * (2 * ld), c.col_ok && row >= 0);
    }
    CUTE_UNROLL
    for (int a = 0; a + 1 < C::AHEAD; ++a) c.ahead[a] = c.ahead[a + 1];
    c.ahead[C::AHEAD - 1] = lane_index(c, k + C::AHEAD);
  }
};

}  // namespace moeblaze::sm90
