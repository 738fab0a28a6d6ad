// Hopper (sm_90a) mainloop: the same cp.async multi-stage pipeline as mainloop.cuh into
// 128-byte-swizzled tiles, with the tensor-core work issued by warpgroups through wgmma on
// shared-memory descriptors. Checked against the CPU reference on an H200 on every GEMM
// family; the warp-specialised variant is warp_specialized.cuh.
//
// Operands, per stage, 128-byte swizzle (PTX ISA "shared memory matrix layout"):
//   K-major ([rows][64 k]): a 64-element row with its 16-byte chunk XORed by (row & 7) is the
//     K-major atom; 8-row atoms of 1024 bytes (stride byte offset); a k16 step advances the
//     start address by 32 bytes inside the atom; leading byte offset unused.
//   MN-major ([64 k][cols], wgmma's transposed operand): columns in 64-wide blocks
//     (swizzle_blocked), each block [64 k][64] with k rows 128 bytes apart: 8-row groups 1024
//     bytes apart (stride byte offset), the next 64 columns one block (64*128 bytes) further
//     (leading byte offset); a k16 step advances the start address by 16 rows = 2048 bytes.
// Tile bases are 1024-byte aligned. A gathered MN-major operand reads the row indices of a
// stage one stage early (StageLoader), so the index load is off the copy-issue path.
//
// Warp layout: warpgroup g computes rows [64g, 64g+64) with one m64nBNk16 per k16 step and
// B tile. Its accumulators are the m16n8 C fragments of warp 4g+w (rows 16(4g+w)..+15) for
// n8 blocks 0..BN/8-1, i.e. the layout of gemm::Tile<BM, BN, 64, BM/16, 1>: the epilogues
// written for mma.sync (for_each_pair) read them unchanged.
#pragma once
#include "moeblaze/gemm/fragment.cuh"
#include "moeblaze/gemm/loaders.cuh"
#include "moeblaze/ptx/wgmma.cuh"

namespace moeblaze::gemm {

// Descriptor of a warpgroup's operand inside a stage tile, and its advance per k16 step (in
// 16-byte units of the start-address field).
template <bool KMAJOR, int BK>
struct Operand {
  // K-major: `first_row` rows down a [rows][64] tile. MN-major: `first_col` columns right in
  // a blocked [BK][cols] tile (a multiple of 64). `tile`: its shared-window address. Returns
  // the descriptor's lower half (sw128_desc_lo); a k16 step adds k16_lo to it, so the stage's
  // descriptors are one 32-bit add each (a 64-bit descriptor add cost two vector instructions).
  static MB_DEV unsigned desc_lo(unsigned tile, int first) {
    if constexpr (KMAJOR) return sw128_desc_lo(tile + 2u * static_cast<unsigned>(first * 64));
    else return sw128_desc_lo(tile + 2u * static_cast<unsigned>((first / 64) * BK * 64), BK * 128);
  }
  static constexpr unsigned k16_lo = KMAJOR ? 32 / 16 : 16 * 128 / 16;
};

// One stage of a warpgroup's tile: BK/16 k16 steps on the stage's shared-memory tiles,
// committed as one wgmma group (the caller waits on it). Stacked K-major B tiles (W1 and W3,
// NB x BN rows one after another) that fit one instruction (NB*BN <= 256) are read by a single
// m64n(NB*BN)k16: acc[NB][1][NT][4] is, flattened, exactly that instruction's accumulator
// order, and wgmma reads A from shared memory once per instruction, so fusing the two
// m64n128 into one m64n256 cuts the shared-memory reads of a k16 step from 12 to 10 KiB
// (shared-memory bandwidth bounds these tiles; measured -10% on gate_up, docs/performance.md).
// A warpgroup that owns MT > 1 m64 slabs (ping-pong tiles) issues one instruction per slab; the
// fused stacked-B instruction then takes its two halves from acc[0][mt] and acc[1][mt] (mma2).
// `stage`: the stage's shared-window address (smem_addr).
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR>
MB_DEV void issue_stage(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], unsigned stage, int warpgroup) {
  using OpA = Operand<A_KMAJOR, Cfg::BK>;
  using OpB = Operand<B_KMAJOR, Cfg::BK>;
  using Instr = Wgmma<(B_KMAJOR && Cfg::NB > 1 && Cfg::NB * Cfg::BN <= 256 ? Cfg::NB * Cfg::BN : Cfg::BN),
                      A_KMAJOR ? 0 : 1, B_KMAJOR ? 0 : 1>;
  constexpr bool FUSE_NB = B_KMAJOR && Cfg::NB > 1 && Cfg::NB * Cfg::BN <= 256;
  constexpr int INSTR_N = FUSE_NB ? Cfg::NB * Cfg::BN : Cfg::BN;  // columns per instruction
  constexpr int INSTRS = FUSE_NB ? 1 : Cfg::NB;                   // instructions per k16 step
  constexpr int ACC = INSTR_N / 2;
  const unsigned a_lo = OpA::desc_lo(stage, warpgroup * Cfg::MT * 64);
  const unsigned b_lo = OpB::desc_lo(stage + 2u * Cfg::A_ELEMS, 0);
  // Offsets from those bases, in descriptor units: slab mt of A, B tile nb.
  constexpr unsigned A_SLAB = A_KMAJOR ? 64 * 64 * 2 / 16 : Cfg::BK * 64 * 2 / 16;
  constexpr unsigned B_TILE = B_KMAJOR ? Cfg::BN * 64 * 2 / 16 : (Cfg::BN / 64) * Cfg::BK * 64 * 2 / 16;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::BK / 16; ++kk)
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; ++mt)
#pragma unroll
      for (int nb = 0; nb < INSTRS; ++nb) {
        const unsigned long long a_desc = sw128_desc_from_lo(a_lo + mt * A_SLAB + kk * OpA::k16_lo);
        const unsigned long long b_desc = sw128_desc_from_lo(b_lo + nb * B_TILE + kk * OpB::k16_lo);
        if constexpr (FUSE_NB && Cfg::MT > 1) {
          static_assert(Cfg::NB == 2, "a fused instruction of two stacked B tiles");
          Instr::mma2(*reinterpret_cast<float(*)[ACC / 2]>(&acc[0][mt][0][0]),
                      *reinterpret_cast<float(*)[ACC / 2]>(&acc[1][mt][0][0]), a_desc, b_desc, 1);
        } else {
          Instr::mma(*reinterpret_cast<float(*)[ACC]>(&acc[nb][mt][0][0]), a_desc, b_desc, 1);
        }
      }
  wgmma_commit();
}

template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc>
MB_DEV void wgmma_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a_src, const BSrc& b_src,
                           int k_size, bf16_t* smem_raw) {
  static_assert(Cfg::WARPS_N == 1 && Cfg::WTM == 16 && Cfg::MT == 1, "wgmma tiles: one 16-row slab per warp");
  static_assert(Cfg::BM % 64 == 0 && Cfg::BK == 64, "wgmma tiles: whole warpgroups, 64-wide k");
  static_assert(Cfg::BN == 64 || Cfg::BN == 128 || Cfg::BN == 192 || Cfg::BN == 256, "wgmma N");
  bf16_t* smem = align_1024(smem_raw);
  const int tid = threadIdx.x, warpgroup = tid / 128;
  zero_accumulators(acc);

  static_assert(B_KMAJOR || Cfg::NB == 1, "stacked B tiles are K-major");
  constexpr int A_ROWS = A_KMAJOR ? Cfg::BM : Cfg::BK, A_COLS = A_KMAJOR ? Cfg::BK : Cfg::BM;
  constexpr int B_ROWS = B_KMAJOR ? Cfg::NB * Cfg::BN : Cfg::BK, B_COLS = B_KMAJOR ? Cfg::BK : Cfg::BN;
  StageLoader<A_ROWS, A_COLS, Cfg::THREADS, A_KMAJOR, ASrc> a_load(a_src, tid);
  StageLoader<B_ROWS, B_COLS, Cfg::THREADS, B_KMAJOR, BSrc> b_load(b_src, tid);
  a_load.fetch(0);
  b_load.fetch(0);
  const int k_tiles = (k_size + Cfg::BK - 1) / Cfg::BK;
#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < k_tiles) {
      bf16_t* stage = smem + s * Cfg::STAGE_ELEMS;
      a_load.load(stage, s * Cfg::BK);
      b_load.load(stage + Cfg::A_ELEMS, s * Cfg::BK);
      a_load.fetch((s + 1) * Cfg::BK);
      b_load.fetch((s + 1) * Cfg::BK);
    }
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<Cfg::STAGES - 2>();
    fence_proxy_async_smem();
    __syncthreads();  // stage kt visible to the async proxy of every warpgroup
    const int next = kt + Cfg::STAGES - 1;
    if (next < k_tiles) {  // the buffer of stage kt-1: its wgmmas completed last iteration
      bf16_t* stage = smem + (next % Cfg::STAGES) * Cfg::STAGE_ELEMS;
      a_load.load(stage, next * Cfg::BK);
      b_load.load(stage + Cfg::A_ELEMS, next * Cfg::BK);
      a_load.fetch((next + 1) * Cfg::BK);
      b_load.fetch((next + 1) * Cfg::BK);
    }
    cp_async_commit();
    issue_stage<Cfg, A_KMAJOR, B_KMAJOR>(acc, smem_addr(smem + (kt % Cfg::STAGES) * Cfg::STAGE_ELEMS), warpgroup);
    wgmma_wait<0>();
  }
  cp_async_wait<0>();
  __syncthreads();
}

}  // namespace moeblaze::gemm
