// down_dgrad's epilogue: the activation's backward from the saved pre-activations and the
// gate, fused with the gate gradient's row-dot. The tile's H (its A and B columns) comes into
// staging by TMA (prefetched into L2 before the mainloop), each element's dA, dB replace its
// A, B there, hg = g h fills a third staging tile, and all three leave by TMA stores: dA / dB
// over H's own rows (dH is H, in place: the tile is the only reader and writer of its
// elements), hg into the backward's column chunk of hg. Per element, the op is DactGate; the
// tile's part of the gate gradient <dh', h> is a row sum over the thread's columns, its quad's,
// then written per row (summed over N tiles in a fixed order by gate_grad).
//
// Each thread reads and writes its own elements' bf16 pairs in the staging tiles (4-byte
// accesses at its accumulator coordinates: the 128-byte swizzle puts a quad's 8 rows in 8
// different 16-byte columns, so a warp's accesses hit 32 banks), so only a few registers live
// beside the accumulators (ldmatrix fragments of A, B and hg would need 192 more).
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/slot_gate.cuh"
#include "moeblaze/sm90/staging.cuh"

namespace moeblaze::sm90 {

// The element op: the activation's backward (act_bwd_element) with what the gate gradient and
// the down wgrad take from it: hg = g h and d h.
template <Activation ACT>
struct DactGate {
  MB_DEV void operator()(float d, float g, float a, float b, float& da, float& db, float& hg, float& dh_h) const {
    float h;
    act_bwd_element<ACT, gate_parts<ACT>()>(a, b, d, g, da, db, h);
    hg = g * h;
    dh_h = d * h;
  }
};

template <class Cfg, int K, int N, Activation ACT>
struct DactGateEpilogue {
  static constexpr int G = gate_parts<ACT>();
  static constexpr int N_TILES = (N + Cfg::BN - 1) / Cfg::BN;
  // Rows a thread's accumulators cover: two (lane / 4 and + 8) per m64 slab it holds.
  static constexpr int M_SLABS = Cfg::WG_ROWS / 64, THREAD_ROWS = 2 * M_SLABS;
  using Tile = StagingTile<Cfg::BM, Cfg::BN>;

  struct Params {
    const void* H_parts[2];   // ragged maps of H's A and B columns [T*K][n]
    const void* dH_parts[2];  // the same of dH (stored)
    const void* hg;           // ragged map of the hg buffer (a backward column chunk)
    float* partials;          // [T*K][N_TILES]
    int col0, row0, rows, hg_col0, n_tile;
    float gate[THREAD_ROWS];  // the thread's rows' gates (0 past the tile's rows)
  };
  struct Storage {
    Tile a, b, hg;
    uint64_t h_full[2];  // H landed, one barrier per ping-pong group
  };
  static constexpr int STAGING_BYTES = 3 * Tile::BYTES + 1024;  // and its barriers, past the 1024-aligned tiles

  static MB_DEV void init(Storage& s) {
    cutlass::arch::ClusterTransactionBarrier::init(&s.h_full[0], 1);
    cutlass::arch::ClusterTransactionBarrier::init(&s.h_full[1], 1);
  }

  // The row of the thread's accumulator rows: (slab m, half h) -> tile row.
  static MB_DEV auto coords(int thread_idx) {
    using namespace cute;
    return typename Cfg::TiledMma{}.get_slice(thread_idx).partition_C(make_identity_tensor(Shape<Int<Cfg::BM>, Int<Cfg::BN>>{}));
  }

  // Before the mainloop: the gates of the thread's rows, and (thread 0) H's boxes into L2.
  template <class P>
  static MB_DEV void prepare(P& p, const RoutingView& rv, int thread_idx) {
    using namespace cute;
    const auto c = coords(thread_idx);
    CUTE_UNROLL
    for (int m = 0; m < M_SLABS; ++m)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = get<0>(c(make_coord(make_coord(0, h, 0), m, 0)));
        p.gate[2 * m + h] = r < p.rows ? slot_gate<K>(rv, p.row0 + r) : 0.f;
      }
    if (thread_idx == 0 && p.rows > 0) {
      Tile::prefetch(p.H_parts[0], p.col0, p.row0, p.rows);
      if constexpr (G == 2) Tile::prefetch(p.H_parts[1], p.col0, p.row0, p.rows);
    }
  }

  template <class Acc>
  static MB_DEV void store(Storage& s, const Acc& acc, int thread_idx, int barrier_id, const Params& p, int iteration) {
    using namespace cute;
    tile_sync<Cfg>(barrier_id);  // the staging tiles are free (see TmaStoreEpilogue)
    if (thread_idx == 0) {
      // A last column tile past n loads only the boxes that start inside n (Tile::live_boxes);
      // its other columns hold stale values, kept out of the gate gradient's dot below and
      // clipped from the stores.
      const int boxes = N % Cfg::BN == 0 ? Tile::BOXES : Tile::live_boxes(p.col0, N);
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.h_full[barrier_id], G * boxes * Tile::BOX_BYTES);
      s.a.load(p.H_parts[0], &s.h_full[barrier_id], p.col0, p.row0, p.rows, boxes);
      if constexpr (G == 2) s.b.load(p.H_parts[1], &s.h_full[barrier_id], p.col0, p.row0, p.rows, boxes);
    }
    cutlass::arch::ClusterTransactionBarrier::wait(&s.h_full[barrier_id], iteration & 1);

    Tensor sA = make_tensor(make_smem_ptr(s.a.data.data()), StagingLayout<Cfg::BM, Cfg::BN>{});
    const uint32_t a_base = cast_smem_ptr_to_uint(s.a.data.data()), b_base = cast_smem_ptr_to_uint(s.b.data.data()),
                   hg_base = cast_smem_ptr_to_uint(s.hg.data.data());
    const auto c = coords(thread_idx);
    const DactGate<ACT> op{};
    const int lane = thread_idx % 32;
    CUTE_UNROLL
    for (int m = 0; m < M_SLABS; ++m)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const float g = p.gate[2 * m + h];
        float dot = 0.f;
        CUTE_UNROLL
        for (int j = 0; j < Cfg::BN / 8; ++j) {
          const auto at0 = make_coord(make_coord(0, h, j), m, 0), at1 = make_coord(make_coord(1, h, j), m, 0);
          const int r = get<0>(c(at0)), col = get<1>(c(at0));  // columns col, col + 1: one 4-byte pair
          // The pair's place in each staging tile (the three share a layout): its offset from
          // the tile's base.
          const uint32_t off = static_cast<uint32_t>(staging_offset(&sA(r, col), s.a.data.data()));
          const float2 a = unpack_bf16x2(lds_b32(a_base + off));
          const float2 b = G == 2 ? unpack_bf16x2(lds_b32(b_base + off)) : float2{0.f, 0.f};
          float da0, da1, db0, db1, hg0, hg1, t0, t1;
          op(acc(at0), g, a.x, b.x, da0, db0, hg0, t0);
          op(acc(at1), g, a.y, b.y, da1, db1, hg1, t1);
          if constexpr (N % Cfg::BN == 0)
            dot += t0 + t1;
          else if (p.col0 + col < N)  // n is even: the pair is in or out together
            dot += t0 + t1;
          sts_b32(a_base + off, pack_bf16x2(da0, da1));
          if constexpr (G == 2) sts_b32(b_base + off, pack_bf16x2(db0, db1));
          sts_b32(hg_base + off, pack_bf16x2(hg0, hg1));
        }
        // The four lanes of a quad hold the row: a fixed-order butterfly, then its first lane.
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        const int r = get<0>(c(make_coord(make_coord(0, h, 0), m, 0)));
        if (lane % 4 == 0 && r < p.rows) p.partials[static_cast<i64>(p.row0 + r) * N_TILES + p.n_tile] = dot;
      }
    cutlass::arch::fence_view_async_shared();
    tile_sync<Cfg>(barrier_id);
    if (thread_idx == 0 && p.rows > 0) {
      s.a.store(p.dH_parts[0], p.col0, p.row0, p.rows);
      if constexpr (G == 2) s.b.store(p.dH_parts[1], p.col0, p.row0, p.rows);
      s.hg.store(p.hg, p.hg_col0, p.row0, p.rows);
      cute::tma_store_arrive();
      cute::tma_store_wait<0>();
    }
  }

  static MB_DEV void drain(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace moeblaze::sm90
