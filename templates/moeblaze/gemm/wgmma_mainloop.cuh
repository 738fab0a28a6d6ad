// Hopper (sm_90a) mainloop: the same cp.async multi-stage pipeline as mainloop.cuh into
// 128-byte-swizzled tiles, with the tensor-core work issued by warpgroups through wgmma on
// shared-memory descriptors. Checked against the CPU reference on an H200 on every GEMM
// family; the warp-specialised variant is ws_mainloop.cuh.
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
#include "moeblaze/gemm/mainloop.cuh"
#include "moeblaze/gemm/mn_map.cuh"
#include "moeblaze/gemm/wgmma_ops.cuh"

namespace moeblaze::gemm {

// Shared-memory matrix descriptor, 128-byte swizzle (PTX ISA "matrix descriptor"): bits 0-13
// start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4 (1024: one
// 8-row atom), 62-63 swizzle mode (1 = 128 B).
MB_DEV unsigned long long sw128_desc(const void* smem, unsigned leading_bytes = 16) {
  const unsigned long long addr = smem_addr(smem);
  return ((addr & 0x3FFFF) >> 4) | (static_cast<unsigned long long>(leading_bytes >> 4) << 16) |
         ((1024ull >> 4) << 32) | (1ull << 62);
}

// Descriptor of a warpgroup's operand inside a stage tile, and its advance per k16 step (in
// 16-byte units of the start-address field).
template <bool KMAJOR, int BK>
struct Operand {
  // K-major: `first_row` rows down a [rows][64] tile. MN-major: `first_col` columns right in
  // a blocked [BK][cols] tile (a multiple of 64).
  static MB_DEV unsigned long long desc(const bf16_t* tile, int first) {
    if constexpr (KMAJOR) return sw128_desc(tile + first * 64);
    else return sw128_desc(tile + (first / 64) * BK * 64, BK * 128);
  }
  static constexpr unsigned long long k16_step = KMAJOR ? 32 / 16 : 16 * 128 / 16;
};

MB_DEV void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
MB_DEV void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
MB_DEV void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy; wgmma reads it through the async
// proxy.
MB_DEV void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Rounds the dynamic shared memory up to the 1024-byte alignment the swizzled atoms need
// (the host reserves 1 KiB extra for wgmma tiles).
MB_DEV bf16_t* align_1024(bf16_t* p) {
  const unsigned long long a = reinterpret_cast<unsigned long long>(p);
  return reinterpret_cast<bf16_t*>((a + 1023) & ~1023ull);
}

// A [BK][COLS] MN-major tile whose rows are k (and move with it), loaded 16 bytes per
// cp.async into the blocked swizzled layout, MnRowMap's thread layout (whole lines per warp
// copy, G chunks per row pointer). The row keys of the next stage are read one stage early
// (fetch), so a gathered row's index load does not stall the copy issue.
template <int ROWS, int COLS, int THREADS, class Src>
struct MnMajorLoader {
  using Map = MnRowMap<ROWS, COLS, THREADS>;
  static constexpr int G = Map::G, R = Map::R, ROW_STEP = Map::ROW_STEP;
  const Src& src;
  int tid;
  int keys[R];  // row keys of the stage to load next (src.key: -1 = no row)
  int k_first;  // the k of the stage to load next (for sources whose rows are contiguous)

  MB_DEV MnMajorLoader(const Src& s, int t) : src(s), tid(t) {}
  MB_DEV void fetch(int k0) {
    k_first = k0;
    if (src.contiguous(k0, ROWS)) return;  // load() needs no keys (a pointer and a stride)
#pragma unroll
    for (int i = 0; i < R; ++i) keys[i] = src.key(k0 + Map::row(tid, i));
  }
  // The G chunks of tile row r from global row p (nullptr: zero-filled).
  MB_DEV void copy_row(bf16_t* smem, int r, const bf16_t* p) const {
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int c = Map::col(tid, j);
      const bool ok = p != nullptr && c < src.limit;
      cp_async16(smem + Map::offset(r, c), ok ? p + c : src.fallback(), ok);
    }
  }
  MB_DEV void load(bf16_t* smem) const {
    if (src.contiguous(k_first, ROWS)) {  // hg, dH: never gathered (see TileLoader::load)
      const bf16_t* p = src.row(k_first + Map::row(tid, 0));
      const i64 step = static_cast<i64>(ROW_STEP) * src.ld;
#pragma unroll
      for (int i = 0; i < R; ++i) copy_row(smem, Map::row(tid, i), p + i * step);
      return;
    }
#pragma unroll
    for (int i = 0; i < R; ++i) copy_row(smem, Map::row(tid, i), keys[i] >= 0 ? src.at(keys[i]) : nullptr);
  }
};

// std::conditional without the standard library (NVRTC compiles these headers alone).
template <bool B, class T, class F>
struct PickType {
  using type = T;
};
template <class T, class F>
struct PickType<false, T, F> {
  using type = F;
};

// The loader of one wgmma operand, stages issued in order: K-major operands keep their rows
// (TileLoader caches the row pointers once); MN-major ones read the row keys of the next stage
// (fetch) right after issuing a stage.
template <int ROWS, int COLS, int THREADS, bool KMAJOR, class Src>
struct StageLoader;
template <int ROWS, int COLS, int THREADS, class Src>
struct StageLoader<ROWS, COLS, THREADS, true, Src> {
  TileLoader<ROWS, COLS, THREADS, true, Src, true> loader;
  MB_DEV StageLoader(const Src& s, int tid) : loader(s, tid) {}
  MB_DEV void fetch(int) {}
  MB_DEV void load(bf16_t* smem, int k0) const { loader.load(smem, k0); }
};
template <int ROWS, int COLS, int THREADS, class Src>
struct StageLoader<ROWS, COLS, THREADS, false, Src> {
  // Sources that never gather (TwoPartRows) keep the plain per-stage path: the key split
  // measured 20-25% slower on up_dgrad (docs/performance.md "Decisions").
  static constexpr bool PREFETCH = Src::kMayGather;
  using Loader = typename PickType<PREFETCH, MnMajorLoader<ROWS, COLS, THREADS, Src>,
                                    TileLoader<ROWS, COLS, THREADS, false, Src, true>>::type;
  Loader loader;
  MB_DEV StageLoader(const Src& s, int tid) : loader(s, tid) {}
  MB_DEV void fetch(int k0) {
    if constexpr (PREFETCH) loader.fetch(k0);
  }
  MB_DEV void load(bf16_t* smem, int k0) const {
    if constexpr (PREFETCH) loader.load(smem);
    else loader.load(smem, k0);
  }
};

template <int NB, int MT, int NT>
MB_DEV void zero_accumulators(float (&acc)[NB][MT][NT][4]) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nb][mt][nt][i] = 0.f;
}

// One stage of a warpgroup's tile: BK/16 k16 steps on the stage's shared-memory tiles,
// committed as one wgmma group (the caller waits on it). Stacked K-major B tiles (W1 and W3,
// NB x BN rows one after another) that fit one instruction (NB*BN <= 256) are read by a single
// m64n(NB*BN)k16: acc[NB][1][NT][4] is, flattened, exactly that instruction's accumulator
// order, and wgmma reads A from shared memory once per instruction, so fusing the two
// m64n128 into one m64n256 cuts the shared-memory reads of a k16 step from 12 to 10 KiB
// (shared-memory bandwidth bounds these tiles; measured -10% on up_proj, docs/performance.md).
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR>
MB_DEV void issue_stage(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const bf16_t* stage, int warpgroup) {
  using OpA = Operand<A_KMAJOR, Cfg::BK>;
  using OpB = Operand<B_KMAJOR, Cfg::BK>;
  constexpr bool FUSE_NB = B_KMAJOR && Cfg::NB > 1 && Cfg::NB * Cfg::BN <= 256;
  constexpr int INSTR_N = FUSE_NB ? Cfg::NB * Cfg::BN : Cfg::BN;  // columns per instruction
  constexpr int INSTRS = FUSE_NB ? 1 : Cfg::NB;                   // instructions per k16 step
  constexpr int ACC = INSTR_N / 2;
  const unsigned long long a_desc = OpA::desc(stage, warpgroup * 64);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::BK / 16; ++kk)
#pragma unroll
    for (int nb = 0; nb < INSTRS; ++nb) {
      const unsigned long long b_desc = OpB::desc(stage + Cfg::A_ELEMS, nb * Cfg::BN);
      Wgmma<INSTR_N, A_KMAJOR ? 0 : 1, B_KMAJOR ? 0 : 1>::mma(*reinterpret_cast<float(*)[ACC]>(&acc[nb][0][0][0]),
                                                             a_desc + OpA::k16_step * kk,
                                                             b_desc + OpB::k16_step * kk, 1);
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
    const bf16_t* stage = smem + (kt % Cfg::STAGES) * Cfg::STAGE_ELEMS;
    issue_stage<Cfg, A_KMAJOR, B_KMAJOR>(acc, stage, warpgroup);
    wgmma_wait<0>();
  }
  cp_async_wait<0>();
  __syncthreads();
}

}  // namespace moeblaze::gemm
