// down_dgrad's epilogue: the activation's backward from the saved pre-activations and the
// gate, fused with the gate gradient's row-dot (see the kernel in expert_gemms.cuh).
// Recomputes h from the saved [A|B], emits dA = g dh' up(B) act'(A), dB = g dh' act(A) up'(B), hg = g h,
// and this tile's part of the gate gradient <dh', h> (summed over tiles in a fixed order by
// gate_grad_reduce). dH may be H (the runtime writes it in place): each epilogue thread loads
// both of its H elements before it stores the dA/dB at the same addresses, and no other thread
// touches them, so H and dH stay plain (not restrict, not read-only-cache) pointers.
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/gemm/epilogue/row_chunks.cuh"
#include "moeblaze/gemm/epilogue/staged_tile.cuh"
#include "moeblaze/gemm/fragment.cuh"
#include "moeblaze/gemm/mainloop/warp_specialized.cuh"
#include "moeblaze/gemm/scheduler/tile_schedule.cuh"
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/ptx/prefetch.cuh"
#include "moeblaze/slot_gate.cuh"

namespace moeblaze::gemm {

// Gates of a slot tile's rows into shared memory (one tile's consumers, THREADS >= BM): the
// epilogue reads them after the mainloop's barrier (__syncthreads, or the consumer barrier
// ws_consume starts with).
template <class Cfg, int K>
MB_DEV void load_tile_gates(const RoutingView& rv, const SlotTile& t, float (&gate_s)[Cfg::BM]) {
  for (int r = consumer_tid<Cfg>(); r < Cfg::BM; r += Cfg::THREADS)
    gate_s[r] = r < t.rows ? slot_gate<K>(rv, t.slot0 + r) : 0.f;
}

// The tile's H lines (its rows' G parts of BN columns, 128 bytes a prefetch) brought into L2
// kAhead k-steps before the epilogue reads them, as a mainloop step hook. H is read once in the
// whole backward, so without it every epilogue load is a DRAM round trip, and a thread waits
// for several of them in turn (dH aliases H, which keeps its loads behind its stores).
template <class Cfg, int N, Activation ACT>
struct PrefetchTileH {
  static constexpr int kAhead = 4;
  static constexpr int G = gate_parts<ACT>();
  static constexpr int SEG = 64, SEGS = (Cfg::BN + SEG - 1) / SEG;  // bf16 a 128-byte line
  // References to what the epilogue keeps live anyway (H's address from the kernel's
  // parameters, the tile's rows): a copy of them held across the mainloop spilled.
  const DownDgradArgs& p;
  const SlotTile& t;
  MB_DEV void operator()() const {
    const bf16_t* tile = static_cast<const bf16_t*>(p.H) + static_cast<i64>(t.slot0) * (G * N) + t.n0;
    const int cols = N - t.n0 < Cfg::BN ? N - t.n0 : Cfg::BN;
#pragma unroll 1  // a few lines a thread; unrolled, its addresses spilled the consumers' registers
    for (int i = consumer_tid<Cfg>(); i < t.rows * G * SEGS; i += Cfg::THREADS) {
      const int r = i / (G * SEGS), part = i / SEGS % G, seg = i % SEGS;
      if (seg * SEG < cols) prefetch_l2(tile + static_cast<i64>(r) * (G * N) + part * N + seg * SEG);
    }
  }
};

// The epilogue proper, on the consumers after the tile's mainloop. STAGED tiles (one-tile wgmma
// blocks) stage H and the results through the stage buffers the mainloop is done with.
template <class Cfg, int N, Activation ACT, bool STAGED>
MB_DEV void dact_gate_epilogue(const float (&acc)[1][Cfg::MT][Cfg::NT][4], const DownDgradArgs& p, const SlotTile& t,
                               const float (&gate_s)[Cfg::BM], float (&red_s)[Cfg::BM][Cfg::WARPS_N], int hg_ld,
                               int hg_col0) {
  constexpr int G = gate_parts<ACT>();
  constexpr int N_TILES = (N + Cfg::BN - 1) / Cfg::BN;

  const bf16_t* H = static_cast<const bf16_t*>(p.H);
  bf16_t* dH = static_cast<bf16_t*>(p.dH);
  bf16_t* hg = static_cast<bf16_t*>(p.hg);
  const int ctid = consumer_tid<Cfg>();
  const int lane = ctid & 31, warp = ctid >> 5;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
  const int cols = N - t.n0 < Cfg::BN ? N - t.n0 : Cfg::BN;  // valid columns of the tile
  const i64 row0 = static_cast<i64>(t.slot0) * (G * N) + t.n0;
  // Where the epilogue reads A/B and writes dA/dB/hg for tile element (r, c): shared memory
  // (staged: the tile's H rows come in and the results go out as whole 16-byte chunks) or
  // global memory directly (persistent tiles, whose pipeline buffers hold the next tile).
  gemm::StagedTile<Cfg::BM, Cfg::BN> sa{nullptr}, sb{nullptr}, sh{nullptr};
  if constexpr (STAGED) {
    gemm::consumer_sync<Cfg>();  // every consumer warpgroup is done with the stage buffers
    bf16_t* sm = gemm::align_1024(gemm::dynamic_smem());
    sa.base = sm;
    sb.base = sm + Cfg::BM * Cfg::BN;
    sh.base = sm + G * Cfg::BM * Cfg::BN;
    sa.load(H + row0, G * N, t.rows, cols, ctid, Cfg::THREADS);
    if constexpr (G == 2) sb.load(H + row0 + N, G * N, t.rows, cols, ctid, Cfg::THREADS);
    cp_async_commit();
    cp_async_wait<0>();
    gemm::consumer_sync<Cfg>();
  }
  auto a_at = [&](int r, int c) -> const bf16_t* {
    if constexpr (STAGED) return sa.at(r, c);
    else return H + row0 + static_cast<i64>(r) * (G * N) + c;
  };
  auto da_at = [&](int r, int c) -> bf16_t* {
    if constexpr (STAGED) return sa.at(r, c);
    else return dH + row0 + static_cast<i64>(r) * (G * N) + c;
  };
  auto db_at = [&](int r, int c) -> bf16_t* {
    if constexpr (STAGED) return sb.at(r, c);
    else return dH + row0 + static_cast<i64>(r) * (G * N) + N + c;
  };
  auto b_at = [&](int r, int c) -> const bf16_t* {
    if constexpr (STAGED) return sb.at(r, c);
    else return H + row0 + static_cast<i64>(r) * (G * N) + N + c;
  };
  auto h_at = [&](int r, int c) -> bf16_t* {
    if constexpr (STAGED) return sh.at(r, c);
    else return hg + static_cast<i64>(t.slot0 + r) * hg_ld + (t.n0 - hg_col0) + c;
  };
  // H straight from global memory (persistent tiles), 16 bytes at a time: the quad's
  // accumulators are transposed (row_chunks.cuh) so that each lane holds 8 consecutive
  // columns of its row; a lane's H loads go out for 2 such chunks before any of their stores
  // (H and dH alias, so the compiler would not move a load above an earlier store; each
  // lane reads and writes only its own elements, which is also why the in-place write is
  // safe).
  // (wgmma tiles only: the mma.sync path, whose fragments share the layout, keeps the
  // one-element-at-a-time epilogue it was verified with.)
  constexpr bool VEC = Cfg::WGMMA && !STAGED && Cfg::NT % 4 == 0;
  if constexpr (VEC) {
    constexpr int BLOCKS = Cfg::NT / 4;  // chunks of 4 n8 blocks: one 8-column chunk per lane
    constexpr int BATCH = BLOCKS % 2 == 0 ? 2 : 1;
    const int q = lane & 3;
    if (is_consumer<Cfg>())
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; ++mt)
      // The row loop stays rolled: one copy of the chunk loop's code instead of two, the
      // pair it reads from each accumulator block picked by selects (the accumulators stay
      // in registers). Measured 3-5% faster on the persistent tile, from fewer math-pipe
      // stalls (ncu), not the instruction cache (no-instruction stalls ~1% either way).
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        const int r = Cfg::acc_row(warp_m, mt) + (lane >> 2) + half * 8;
        const bool row_ok = r < t.rows;
        const float g = gate_s[r];
        const bf16_t* a_row = H + row0 + static_cast<i64>(r) * (G * N);
        bf16_t* da_row = dH + row0 + static_cast<i64>(r) * (G * N);
        bf16_t* h_row = hg + static_cast<i64>(t.slot0 + r) * hg_ld + (t.n0 - hg_col0);
        float dot = 0.f;
#pragma unroll
        for (int b0 = 0; b0 < BLOCKS; b0 += BATCH) {
          uint4 a_raw[BATCH], b_raw[BATCH];
#pragma unroll
          for (int j = 0; j < BATCH; ++j) {
            const int c = warp_n * Cfg::WTN + ((b0 + j) * 4 + q) * 8;
            if (!row_ok || c >= cols) continue;
            a_raw[j] = *reinterpret_cast<const uint4*>(a_row + c);
            if constexpr (G == 2) b_raw[j] = *reinterpret_cast<const uint4*>(a_row + N + c);
          }
#pragma unroll
          for (int j = 0; j < BATCH; ++j) {
            float x[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float(&pair)[4] = acc[0][mt][(b0 + j) * 4 + i];
              x[i][0] = half ? pair[2] : pair[0];
              x[i][1] = half ? pair[3] : pair[1];
            }
            gemm::quad_transpose(x, lane);  // every lane: shuffles
            const int c = warp_n * Cfg::WTN + ((b0 + j) * 4 + q) * 8;
            if (!row_ok || c >= cols) continue;
            float av[8], bv[8], da[8], db[8], hh[8];
            gemm::unpack8(a_raw[j], av);
            if constexpr (G == 2) gemm::unpack8(b_raw[j], bv);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              const float d = x[e >> 1][e & 1];
              float h;
              act_bwd_element<ACT, G>(av[e], G == 2 ? bv[e] : 0.f, d, g, da[e], db[e], h);
              hh[e] = g * h;
              dot += d * h;
            }
            if constexpr (G == 2) *reinterpret_cast<uint4*>(da_row + N + c) = gemm::pack8(db);
            *reinterpret_cast<uint4*>(da_row + c) = gemm::pack8(da);
            *reinterpret_cast<uint4*>(h_row + c) = gemm::pack8(hh);
          }
        }
        // The four lanes of a quad hold the same row: fixed-order butterfly, then per warp.
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        if ((lane & 3) == 0) red_s[r][warp_n] = dot;
      }
  }
  // H straight from global memory (persistent tiles): a thread's H loads go out CH at a time,
  // all of a batch before any of its dA/dB stores. One element at a time, each load waited
  // for its own round trip: H and dH alias (in place), so the compiler cannot hoist a load
  // above the previous element's stores, and a 128x256 tile's thread made 64 such trips.
  // Batching is safe for the same reason the in-place write is: each thread reads and writes
  // only its own elements. Staged tiles read shared memory: one at a time.
  constexpr int CH = STAGED || !Cfg::WGMMA ? 1 : Cfg::NT % 16 == 0 ? 16 : Cfg::NT % 8 == 0 ? 8 : 1;
  if (!VEC && is_consumer<Cfg>())  // a warp-specialised tile's producer holds no accumulators
#pragma unroll
  for (int mt = 0; mt < Cfg::MT; ++mt)
#pragma unroll 1  // rolled, as the 16-byte path's (the pair picked by selects)
    for (int half = 0; half < 2; ++half) {
      const int r = Cfg::acc_row(warp_m, mt) + (lane >> 2) + half * 8;
      const bool row_ok = r < t.rows;
      const float g = gate_s[r];
      float dot = 0.f;
#pragma unroll
      for (int nc = 0; nc < Cfg::NT; nc += CH) {
        __nv_bfloat162 a_raw[CH], b_raw[CH];
#pragma unroll
        for (int j = 0; j < CH; ++j) {
          const int c = warp_n * Cfg::WTN + (nc + j) * 8 + (lane & 3) * 2;
          if (!row_ok || c >= cols) continue;
          a_raw[j] = *reinterpret_cast<const __nv_bfloat162*>(a_at(r, c));
          if constexpr (G == 2) b_raw[j] = *reinterpret_cast<const __nv_bfloat162*>(b_at(r, c));
        }
#pragma unroll
        for (int j = 0; j < CH; ++j) {
          const int nt = nc + j;
          const int c = warp_n * Cfg::WTN + nt * 8 + (lane & 3) * 2;
          if (!row_ok || c >= cols) continue;
          const float(&pair)[4] = acc[0][mt][nt];
          const float d0 = half ? pair[2] : pair[0], d1 = half ? pair[3] : pair[1];
          const float2 av = __bfloat1622float2(a_raw[j]);
          const float2 bv = G == 2 ? __bfloat1622float2(b_raw[j]) : float2{0.f, 0.f};
          float h0, h1, da0, da1, db0, db1;
          act_bwd_element<ACT, G>(av.x, bv.x, d0, g, da0, db0, h0);
          act_bwd_element<ACT, G>(av.y, bv.y, d1, g, da1, db1, h1);
          if constexpr (G == 2) store_bf16x2(db_at(r, c), db0, db1);
          store_bf16x2(da_at(r, c), da0, da1);
          store_bf16x2(h_at(r, c), g * h0, g * h1);
          dot += d0 * h0 + d1 * h1;
        }
      }
      // The four lanes of a quad hold the same row: fixed-order butterfly, then per warp.
      dot += __shfl_xor_sync(0xffffffffu, dot, 1);
      dot += __shfl_xor_sync(0xffffffffu, dot, 2);
      if ((lane & 3) == 0) red_s[r][warp_n] = dot;
    }
  // Consumers only: a warp-specialised block's producer is elsewhere (on the next tile when
  // persistent). Every consumer is past its gate_s reads here, so the next tile may rewrite
  // gate_s.
  if (is_consumer<Cfg>()) gemm::consumer_sync<Cfg>();
  if constexpr (STAGED) {  // dA, dB over the tile's H rows, hg: whole 16-byte chunks
    sa.store(dH + row0, G * N, t.rows, cols, ctid, Cfg::THREADS);
    if constexpr (G == 2) sb.store(dH + row0 + N, G * N, t.rows, cols, ctid, Cfg::THREADS);
    sh.store(hg + static_cast<i64>(t.slot0) * hg_ld + (t.n0 - hg_col0), hg_ld, t.rows, cols, ctid,
             Cfg::THREADS);
  }
  for (int r = ctid; r < t.rows; r += Cfg::THREADS) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < Cfg::WARPS_N; ++w) s += red_s[r][w];
    p.gate_partials[static_cast<i64>(t.slot0 + r) * N_TILES + t.n_tile] = s;
  }
}

}  // namespace moeblaze::gemm
