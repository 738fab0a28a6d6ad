// Where a tile's operand stages come from when TMA loads them: the two layouts a stage can have
// (config.cuh StageLayout), each one or more boxes of a 2-D tensor map a k step (the maps are
// encoded by the host, runtime/tma.cpp). load<ROWS, SHARERS>(k, full, stage, rank) issues k step
// k's boxes into `stage`, completing on `full`; with SHARERS = 2 (a cluster pair's B) the block
// of `rank` issues its share of the boxes, multicast into both blocks' stage. One thread issues
// them: a TMA source has no per-thread copy state (thread_copy), unlike a gathered one
// (operand_gather.cuh).
#pragma once
#include "moeblaze/sm90/config.cuh"

namespace moeblaze::sm90 {

constexpr uint64_t kTmaHint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);

// What a copying thread keeps of a source for a tile: a gathered source's row addresses
// (operand_gather.cuh), nothing for a TMA source.
struct NoThreadCopy {};
template <int ROWS, class Source>
MB_DEV auto thread_copy(const Source& s, int ptid) {
  if constexpr (Source::GATHERED) return s.template thread_copy<ROWS>(ptid);
  else return NoThreadCopy{};
}

template <int SHARERS>
MB_DEV void tma_box(const void* map, uint64_t* full, Element* smem, int c0, int c1) {
  if constexpr (SHARERS == 1) {
    cute::SM90_TMA_LOAD_2D::copy(map, full, kTmaHint, smem, c0, c1);
  } else {
    cute::SM90_TMA_LOAD_MULTICAST_2D::copy(map, full, static_cast<uint16_t>((1 << SHARERS) - 1), kTmaHint, smem, c0, c1);
  }
}

// K-major: rows [row, +ROWS) of `map`, k columns [64 k, +64): one [ROWS][64] box (a pair: each
// block ROWS / 2 rows).
struct TmaRowsK {
  static constexpr bool GATHERED = false;
  static constexpr Major MAJOR = Major::k;
  const void* map;
  int row;

  template <int ROWS, int SHARERS>
  MB_DEV void load(int k, uint64_t* full, Element* stage, int rank) const {
    constexpr int PART = ROWS / SHARERS;
    const int share = SHARERS == 1 ? 0 : rank;  // an operand the block loads alone takes all its rows
    tma_box<SHARERS>(map, full, stage + share * (PART * 64), k * 64, row + share * PART);
  }
};

// MN-major: k rows [64 k, +64) of a reduction that runs through map[0]'s rows [row0, row0 +
// split), then map[1]'s (gate_up_dgrad's W1_e then W3_e), columns [col0, +ROWS) as 64-column
// [64][64] boxes (a pair: alternate boxes from each block).
struct TmaColsMN {
  static constexpr bool GATHERED = false;
  static constexpr Major MAJOR = Major::mn;
  const void* map[2];
  int row0, split, col0;

  template <int ROWS, int SHARERS>
  MB_DEV void load(int k, uint64_t* full, Element* stage, int rank) const {
    const int kr = k * 64;
    const int part = kr >= split ? 1 : 0;
    const void* m = part ? map[1] : map[0];  // a select: indexing the array would put it in local memory
    const int r = row0 + kr - part * split;
    CUTE_UNROLL
    for (int b = 0; b < ROWS / 64; ++b)
      if (SHARERS == 1 || b % SHARERS == rank) tma_box<SHARERS>(m, full, stage + b * (64 * 64), col0 + b * 64, r);
  }
};

// K-major, the stage's rows stacked from two maps: rows [0, ROWS / 2) are map[0]'s rows [row,
// +ROWS / 2), rows [ROWS / 2, ROWS) map[1]'s (gate_up's W1_e and W3_e rows of one N tile: the
// accumulator's left half is A = x W1^T, its right half B = x W3^T, each thread holding both
// halves of its columns). In a cluster pair block `rank` loads map[rank]'s half, multicast.
struct TmaRowsK2 {
  static constexpr bool GATHERED = false;
  static constexpr Major MAJOR = Major::k;
  const void* map[2];
  int row;

  template <int ROWS, int SHARERS>
  MB_DEV void load(int k, uint64_t* full, Element* stage, int rank) const {
    static_assert(SHARERS == 1 || SHARERS == 2, "one block, or a pair taking a map each");
    if constexpr (SHARERS == 1) {
      tma_box<1>(map[0], full, stage, k * 64, row);
      tma_box<1>(map[1], full, stage + (ROWS / 2) * 64, k * 64, row);
    } else {
      const void* m = rank ? map[1] : map[0];  // a select: indexing would put the array in local memory
      tma_box<2>(m, full, stage + rank * (ROWS / 2) * 64, k * 64, row);
    }
  }
};

// MN-major, k rows along a group of rows of a ragged map (the weight gradients' reduction over an
// expert's slots: dH, hg): step k's k rows are the map's rows [row0 + 64 k, +64) clipped at
// row0 + rows (rows past it are zero-filled by the TMA unit, not the next expert's), columns
// [col0, +ROWS) as [64][64] boxes (a pair: alternate boxes from each block, multicast).
struct TmaRaggedColsMN {
  static constexpr bool GATHERED = false;
  static constexpr Major MAJOR = Major::mn;
  const void* map;
  int row0, rows, col0;

  template <int ROWS, int SHARERS>
  MB_DEV void load(int k, uint64_t* full, Element* stage, int rank) const {
    static_assert(SHARERS == 1 || (ROWS / 64) % SHARERS == 0, "a pair's boxes split evenly");
    const int left = rows - 64 * k;  // the group's rows from this step on
    CUTE_UNROLL
    for (int b = 0; b < ROWS / 64; ++b) {
      if constexpr (SHARERS == 1) {
        cute::SM90_TMA_LOAD_3D::copy(map, full, kTmaHint, stage + b * (64 * 64), col0 + b * 64, (1 << 30) - left,
                                     row0 + 64 * k + left);
      } else if (b % SHARERS == rank) {
        cute::SM90_TMA_LOAD_MULTICAST_3D::copy(map, full, static_cast<uint16_t>((1 << SHARERS) - 1), kTmaHint,
                                               stage + b * (64 * 64), col0 + b * 64, (1 << 30) - left,
                                               row0 + 64 * k + left);
      }
    }
  }
};

// A tile's operands: k_tiles k steps of A and B.
template <class ASource, class BSource>
struct Operands {
  static constexpr Major A_MAJOR = ASource::MAJOR, B_MAJOR = BSource::MAJOR;
  static constexpr bool A_GATHERED = ASource::GATHERED, B_GATHERED = BSource::GATHERED;
  ASource a;
  BSource b;
  int k_tiles;
};
template <class ASource, class BSource>
MB_DEV Operands<ASource, BSource> operands(ASource a, BSource b, int k_tiles) {
  return {a, b, k_tiles};
}

}  // namespace moeblaze::sm90
