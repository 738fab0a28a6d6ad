// The weight gradients' epilogue: a tile of dW_e (rows [row0, +BM), columns [col0, +BN) of
// expert `expert`'s matrix) out by TMA through the output's 3-D map ([E][rows][cols],
// runtime/tma.hpp OutputMapParams: rows and columns past the matrix are clipped), as
// GradOutput asks: bf16 stores, bf16 reduce-adds into the gradient already there (accumulation
// over micro-batches), or fp32 reduce-adds into a main gradient. One tile owns its elements, so
// the adds need no ordering between tiles; a tile's sum over the expert's slots is the
// mainloop's, in slot order: deterministic.
#pragma once
#include "moeblaze/sm90/staging.cuh"

namespace moeblaze::sm90 {

// Where a tile goes: rows [0, split) of the tile to `map` from row0 on, rows [split, BM) to
// `map2` from row2 on (a tile straddling two matrices stacked along its rows: gate_up_wgrad's
// dW1 | dW3 where n is not a multiple of BM); split >= BM or map2 == nullptr: all of it to `map`.
struct WgradOutput {
  const void* map;   // bf16 or fp32 (GradOutput::add_f32) output map
  const void* map2;  // the second matrix's, or nullptr
  int expert, row0, split, row2, col0;
  int grad_output;
};

// PIECE_ROWS: the rows one TMA store covers (the output maps' box rows). BM stores a block in
// one box; a tile that may straddle two matrices stores 64-row pieces (the host encodes 64-row
// boxes: runtime/tma.cpp attach_output_maps), each inside one matrix at a row coordinate of 0 or
// more. A whole-tile box sent to both matrices, each clipping the other's rows, needs a negative
// row coordinate for the second, and that TMA store faults (illegal instruction, H100).
template <class Cfg, int PIECE_ROWS = Cfg::BM>
struct WgradEpilogue {
  static_assert(PIECE_ROWS == Cfg::BM || PIECE_ROWS == 64, "whole-tile boxes or 64-row pieces");
  using Params = WgradOutput;
  static constexpr int PIECES = Cfg::BM / PIECE_ROWS;
  // The tile leaves in blocks of 128 bytes a row through two staging buffers in turn: bf16
  // [BM][64] (one 64-column box) or fp32 [BM][32] (one 32-column box, the same bytes). A block is
  // written while the block before it is still being stored, and the wait for a buffer's reads
  // falls two blocks later (the next tile's first blocks under its mainloop): the last
  // block's store is never waited for in the tile. Two 16 KiB buffers instead of a whole 64 KiB
  // 128 x 256 tile leave room for a fourth operand stage.
  static constexpr int BF16_BLOCK = 64, F32_BLOCK = 32;
  static constexpr int BF16_BLOCKS = Cfg::BN / BF16_BLOCK, F32_BLOCKS = Cfg::BN / F32_BLOCK;
  using BlockMma = typename Cfg::template TiledMmaN<BF16_BLOCK>;
  using Block = StagingTile<Cfg::BM, BF16_BLOCK>;
  using F32Layout = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<float>{},
                                                 cute::make_shape(cute::Int<Cfg::BM>{}, cute::Int<F32_BLOCK>{})));
  static_assert(Block::BYTES == Cfg::BM * F32_BLOCK * 4, "an fp32 block fills a bf16 block's bytes");
  struct Storage {
    Block buffer[2];
  };
  static constexpr int STAGING_BYTES = 2 * Block::BYTES;

  static MB_DEV void init(Storage&) {}

  // Piece q's map and first row (rows [q PIECE_ROWS, +PIECE_ROWS) of the tile: 128-byte rows of a
  // staging block, so a piece starts q PIECE_ROWS 128 bytes in, a whole number of swizzle atoms).
  struct Piece {
    const void* map;
    int row;
  };
  static MB_DEV Piece piece(const Params& p, int q) {
    const int local = q * PIECE_ROWS;
    if (p.map2 && local >= p.split) return {p.map2, p.row2 + (local - p.split)};
    return {p.map, p.row0 + local};
  }

  // Block `block` of this consumer group's store sequence may take buffer block % 2 once the
  // stores issued from it two blocks earlier have read it (each block's stores are one bulk
  // group of thread 0's).
  static MB_DEV void acquire(int thread_idx, int barrier_id) {
    if (thread_idx == 0) cute::tma_store_wait<1>();
    tile_sync<Cfg>(barrier_id);
  }
  static MB_DEV void publish(int barrier_id) {
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes before the TMA unit reads
    tile_sync<Cfg>(barrier_id);
  }

  template <class Acc>
  static MB_DEV void store(Storage& s, const Acc& acc, int thread_idx, int barrier_id, const Params& p, int iteration) {
    using namespace cute;
    if (p.grad_output != static_cast<int>(GradOutput::add_f32)) {
      const bool add = p.grad_output == static_cast<int>(GradOutput::add_bf16);
      CUTE_UNROLL
      for (int b = 0; b < BF16_BLOCKS; ++b) {
        // Columns [64 b, +64): the accumulator's 8-column groups j in [8 b, 8 b + 8) (fragment
        // modes ((2 columns, 2 row halves, BN / 8 groups), M tiles, 1)).
        auto rD = bf16_fragment(partition_fragment_C(BlockMma{}, Shape<Int<Cfg::BM>, Int<BF16_BLOCK>>{}));
        CUTE_UNROLL
        for (int m = 0; m < size<1>(acc); ++m)
          CUTE_UNROLL
          for (int j = 0; j < BF16_BLOCK / 8; ++j)
            CUTE_UNROLL
            for (int v = 0; v < 4; ++v)
              rD(make_coord(make_coord(v % 2, v / 2, j), m, 0)) =
                  Element(acc(make_coord(make_coord(v % 2, v / 2, b * (BF16_BLOCK / 8) + j), m, 0)));
        Block& buf = s.buffer[(iteration * BF16_BLOCKS + b) & 1];
        acquire(thread_idx, barrier_id);
        buf.template write<BlockMma>(rD, thread_idx);
        publish(barrier_id);
        if (thread_idx == 0) {
          CUTE_UNROLL
          for (int q = 0; q < PIECES; ++q) {
            const Piece at = piece(p, q);
            const Element* src = buf.data.data() + q * PIECE_ROWS * BF16_BLOCK;
            if (add) SM90_TMA_REDUCE_ADD_3D::copy(at.map, src, p.col0 + b * BF16_BLOCK, at.row, p.expert);
            else SM90_TMA_STORE_3D::copy(at.map, src, p.col0 + b * BF16_BLOCK, at.row, p.expert);
          }
          tma_store_arrive();
        }
      }
    } else {
      // fp32 main gradient: reduce-adds of 32-column blocks. Groups j of 8 columns fall in a
      // block by their index alone, so each block's loop is unrolled code.
      const auto c = typename Cfg::TiledMma{}.get_slice(thread_idx).partition_C(
          make_identity_tensor(Shape<Int<Cfg::BM>, Int<Cfg::BN>>{}));
      CUTE_UNROLL
      for (int b = 0; b < F32_BLOCKS; ++b) {
        Block& buf = s.buffer[(iteration * F32_BLOCKS + b) & 1];
        float* f32 = reinterpret_cast<float*>(buf.data.data());
        Tensor sF = make_tensor(make_smem_ptr(f32), F32Layout{});
        const uint32_t base = cast_smem_ptr_to_uint(f32);
        acquire(thread_idx, barrier_id);
        CUTE_UNROLL
        for (int m = 0; m < size<1>(acc); ++m)
          CUTE_UNROLL
          for (int j = b * (F32_BLOCK / 8); j < (b + 1) * (F32_BLOCK / 8); ++j)
            CUTE_UNROLL
            for (int h = 0; h < 2; ++h) {
              const auto at0 = make_coord(make_coord(0, h, j), m, 0), at1 = make_coord(make_coord(1, h, j), m, 0);
              const int r = get<0>(c(at0)), col = get<1>(c(at0)) - b * F32_BLOCK;
              sts_v2_f32(base + static_cast<uint32_t>(staging_offset(&sF(r, col), f32)), acc(at0), acc(at1));
            }
        publish(barrier_id);
        if (thread_idx == 0) {
          CUTE_UNROLL
          for (int q = 0; q < PIECES; ++q) {
            const Piece at = piece(p, q);
            SM90_TMA_REDUCE_ADD_3D::copy(at.map, f32 + q * PIECE_ROWS * F32_BLOCK, p.col0 + b * F32_BLOCK, at.row, p.expert);
          }
          tma_store_arrive();
        }
      }
    }
    // Ping-pong groups share the buffers and each group's thread 0 waits only for its own
    // stores: the buffers go to the other group read.
    if constexpr (Cfg::PINGPONG) {
      if (thread_idx == 0) tma_store_wait<0>();
    }
  }

  static MB_DEV void drain(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace moeblaze::sm90
