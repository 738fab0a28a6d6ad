// The expert GEMMs of the layer (DESIGN.md 1.3), each a grouped GEMM over experts with
// its gather fused into the operand load and its elementwise work fused into the epilogue.
// Shape parameters are compiled in: E experts, K picks, D model width, N expert width,
// ACT activation. G = 2 for gated activations ([A|B] side by side), else 1. W_ROWS: rows of
// one expert in the W1/W3 storage (and in dW1/dW3): N for two [E,N,D] tensors, 2N for the
// fused gate_up [E,2N,D] (WeightLayout::fused_gate_up; the host passes W3 = W1 + N*D).
// BIAS: per-expert biases (GPT-OSS): [E, G*N] added to [A|B] before H is stored (so the
// backward's H, and its dH, are those of the biased pre-activations), [E, D] added to o.
#pragma once
#include "moeblaze/gemm/ws_mainloop.cuh"
#include "moeblaze/gemm/row_chunks.cuh"
#include "moeblaze/gemm/rows.cuh"
#include "moeblaze/gemm/staged_tile.cuh"
#include "moeblaze/gemm/tma_store.cuh"
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/slot_gate.cuh"

namespace moeblaze {

template <Activation ACT>
constexpr int gate_parts() { return is_gated(ACT) ? 2 : 1; }

// ---- forward: up-projection ------------------------------------------------------------
// Per expert e: [A|B] = gather(x) [W1_e; W3_e]^T, x read once for both matrices.
// Writes H = [A|B] (when saved) and h = act(A) * up(B) (when the down-projection needs it).
template <class Cfg, int E, int D, int N, Activation ACT, int W_ROWS, bool BIAS>
MB_DEV void up_proj(const UpProjArgs& p) {
  constexpr int G = gate_parts<ACT>();
  static_assert(Cfg::NB == G, "gated activations stack W1 and W3 tiles");
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::SlotTile t =
        p.slot_hi > 0
            ? gemm::chunk_slot_tile<Cfg::BM, Cfg::BN, E, N, Cfg::SWAP>(tile, p.rv.expert_token_offsets, p.slot_lo, p.slot_hi)
            : gemm::slot_tile<Cfg::BM, Cfg::BN, E, N, Cfg::SWAP>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets);
    if (!t.valid) return false;
    const bf16_t* x = static_cast<const bf16_t*>(p.x);
    const i64 w_off = (static_cast<i64>(t.expert) * W_ROWS + t.n0) * D;
    const int n_rows = N - t.n0 < Cfg::BN ? N - t.n0 : Cfg::BN;
    const gemm::Rows a{x, p.rv.expert_token_indices + t.slot0, t.rows, D, D};
    float acc[Cfg::NB][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA) {  // W1/W3 rows [e*W_ROWS + n0, +BN) of the maps (rows past N: unused columns)
      gemm::TmaRows<G> b;
      b.map[0] = &p.tma_w1;
      if constexpr (G == 2) b.map[G - 1] = &p.tma_w3;
      b.row = t.expert * W_ROWS + t.n0;
      gemm::run_mainloop<Cfg, true, true>(acc, a, b, D, gemm::dynamic_smem(), pipe, role);
    } else {
      const gemm::TwoPartRows b{static_cast<const bf16_t*>(p.w1) + w_off,
                                G == 2 ? static_cast<const bf16_t*>(p.w3) + w_off : nullptr,
                                Cfg::BN, n_rows, G == 2 ? n_rows : 0, D, D};
      gemm::run_mainloop<Cfg, true, true>(acc, a, b, D, gemm::dynamic_smem(), pipe, role);
    }
    if constexpr (!decltype(role)::kComputes) return true;  // the producer: loads only

    bf16_t* H = static_cast<bf16_t*>(p.H);
    bf16_t* h = static_cast<bf16_t*>(p.h);
    auto store = [&](int r, int c, float a0, float a1, float b0, float b1) {
      const int col = t.n0 + c;
      if (r >= t.rows || col >= N) return;
      const i64 slot = t.slot0 + r;
      if constexpr (BIAS) {  // [gate | up] biases of the expert (col is even: 4-byte loads)
        const bf16_t* bias = static_cast<const bf16_t*>(p.bias) + static_cast<i64>(t.expert) * (G * N) + col;
        const float2 ba = load_bf16x2(bias);
        a0 += ba.x; a1 += ba.y;
        if constexpr (G == 2) {
          const float2 bb = load_bf16x2(bias + N);
          b0 += bb.x; b1 += bb.y;
        }
      }
      // Round first so that h here equals what backward recomputes from the saved H.
      a0 = bf2f(f2bf(a0)); a1 = bf2f(f2bf(a1));
      b0 = bf2f(f2bf(b0)); b1 = bf2f(f2bf(b1));
      if (H) {
        store_bf16x2(H + slot * (G * N) + col, a0, a1);
        if constexpr (G == 2) store_bf16x2(H + slot * (G * N) + N + col, b0, b1);
      }
      if (h) {
        const i64 h_row = slot - p.slot_lo;
        if constexpr (G == 2)
          store_bf16x2(h + h_row * N + col, act_fwd<ACT>(a0) * act_up<ACT>(b0), act_fwd<ACT>(a1) * act_up<ACT>(b1));
        else store_bf16x2(h + h_row * N + col, act_fwd<ACT>(a0), act_fwd<ACT>(a1));
      }
    };
    if constexpr (G == 2) {
      gemm::for_each_pair<Cfg>(acc, store);
    } else {
      gemm::for_each_pair<Cfg>(acc, [&](int r, int c, float a0, float a1) { store(r, c, a0, a1, 0.f, 0.f); });
    }
    return true;
  });
}

// ---- forward: down-projection ------------------------------------------------------------
// o = h W2_e^T (+ the expert's bias) per slot (expert-major order); the gate is applied by the
// combine.
template <class Cfg, int E, int D, int N, bool BIAS>
MB_DEV void down_proj(const DownProjArgs& p) {
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::SlotTile t =
        p.slot_hi > 0
            ? gemm::chunk_slot_tile<Cfg::BM, Cfg::BN, E, D, Cfg::SWAP>(tile, p.rv.expert_token_offsets, p.slot_lo, p.slot_hi)
            : gemm::slot_tile<Cfg::BM, Cfg::BN, E, D, Cfg::SWAP>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets);
    if (!t.valid) return false;
    const bf16_t* h = static_cast<const bf16_t*>(p.h);
    const bf16_t* w2 = static_cast<const bf16_t*>(p.w2);
    const gemm::Rows a{h + static_cast<i64>(t.slot0 - p.slot_lo) * N, nullptr, t.rows, N, N};
    float acc[1][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA) {  // W2 rows [e*D + n0, +BN) of the [E*D, N] map; h rows of the
      // tile from the h buffer's map (rows past the tile feed output rows that are not stored)
      const gemm::TmaRows<1> at{{&p.tma_h}, t.slot0 - p.slot_lo};
      const gemm::TmaRows<1> b{{&p.tma_w2}, t.expert * D + t.n0};
      gemm::run_mainloop<Cfg, true, true>(acc, at, b, N, gemm::dynamic_smem(), pipe, role);
    } else {
      const gemm::Rows b{w2 + (static_cast<i64>(t.expert) * D + t.n0) * N, nullptr,
                         D - t.n0 < Cfg::BN ? D - t.n0 : Cfg::BN, N, N};
      gemm::run_mainloop<Cfg, true, true>(acc, a, b, N, gemm::dynamic_smem(), pipe, role);
    }
    if constexpr (!decltype(role)::kComputes) return true;  // the producer: loads only
    bf16_t* o = static_cast<bf16_t*>(p.o);
    gemm::for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
      const int col = t.n0 + c;
      if (r >= t.rows || col >= D) return;
      if constexpr (BIAS) {
        const float2 b = load_bf16x2(static_cast<const bf16_t*>(p.bias) + static_cast<i64>(t.expert) * D + col);
        v0 += b.x;
        v1 += b.y;
      }
      store_bf16x2(o + static_cast<i64>(t.slot0 + r) * D + col, v0, v1);
  });
  return true;
  });
}

// The activation's backward at one element of down_dgrad's epilogue: dh' value d, gate g, the
// saved pre-activations a (and b, gated) -> dA, dB (gated; else 0) and h = act(a) [* up(b)].
template <Activation ACT, int G>
MB_DEV void act_bwd_element(float a, float b, float d, float g, float& da, float& db, float& h) {
  float s, ds;
  act_fwd_grad<ACT>(a, s, ds);
  if constexpr (G == 2) {
    const float u = act_up<ACT>(b);
    h = s * u;
    da = g * d * u * ds;
    db = g * d * s * act_up_grad<ACT>(b);
  } else {
    h = s;
    da = g * d * ds;
    db = 0.f;
  }
}

// ---- backward: down-projection dgrad -------------------------------------------------------
// dh' = gather(dy) W2_e. Epilogue: recompute h from the saved [A|B], emit
// dA = g dh' B act'(A), dB = g dh' act(A), hg = g h, and this tile's part of the gate
// gradient <dh', h> (summed over tiles in a fixed order by gate_grad_reduce). dH may be H
// (the runtime writes it in place): each epilogue thread loads both of its H elements before
// it stores the dA/dB at the same addresses, and no other thread touches them, so H and dH
// stay plain (not restrict, not read-only-cache) pointers.
template <class Cfg, int E, int K, int D, int N, Activation ACT>
MB_DEV void down_dgrad(const DownDgradArgs& p) {
  constexpr int G = gate_parts<ACT>();
  constexpr int N_TILES = (N + Cfg::BN - 1) / Cfg::BN;
  // One-tile wgmma blocks stage the epilogue's H tile and its results through the stage
  // buffers the mainloop is done with ((G+1) BM x BN tiles: 96 KiB at 128x128 s3, 192 KiB at
  // 128x256 s4); persistent blocks' producers are filling them with the next tile already.
  constexpr bool STAGED = Cfg::WGMMA && !Cfg::PERSISTENT && (G + 1) * Cfg::BM * Cfg::BN <= Cfg::STAGES * Cfg::STAGE_ELEMS;
  __shared__ float gate_s[Cfg::BM];
  __shared__ float red_s[Cfg::BM][Cfg::WARPS_N];
  const int hg_ld = p.n_tiles > 0 ? p.hg_ld : N, hg_col0 = p.n_tiles > 0 ? p.n_tile_lo * Cfg::BN : 0;
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::SlotTile t =
        p.n_tiles > 0 ? gemm::slot_tile_cols<Cfg::BM, Cfg::BN, E, Cfg::SWAP>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets,
                                                                  p.n_tiles, p.n_tile_lo)
                      : gemm::slot_tile<Cfg::BM, Cfg::BN, E, N, Cfg::SWAP>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets);
    if (!t.valid) return false;
    const bf16_t* dy = static_cast<const bf16_t*>(p.dy);
    const bf16_t* w2 = static_cast<const bf16_t*>(p.w2);
    const gemm::Rows a{dy, p.rv.expert_token_indices + t.slot0, t.rows, D, D};
    const gemm::Rows b{w2 + static_cast<i64>(t.expert) * D * N + t.n0, nullptr, D, N, N - t.n0};
    float acc[1][Cfg::MT][Cfg::NT][4];
    // Computing threads only (THREADS >= BM): the gates are visible to every consumer after
    // the mainloop's barrier (__syncthreads, or the consumer barrier ws_consume starts with).
    if constexpr (decltype(role)::kComputes)
      for (int r = threadIdx.x; r < Cfg::BM; r += Cfg::THREADS)
        gate_s[r] = r < t.rows ? slot_gate<K>(p.rv, t.slot0 + r, t.expert) : 0.f;
    if constexpr (Cfg::TMA) {  // W2_e's k rows [k0, +64) of the [E*D, N] map (D % 64 == 0)
      const gemm::TmaMnWeights<1> bt{{&p.tma_w2}, t.expert * D, D, t.n0};
      gemm::run_mainloop<Cfg, true, false>(acc, a, bt, D, gemm::dynamic_smem(), pipe, role);
    } else {
      gemm::run_mainloop<Cfg, true, false>(acc, a, b, D, gemm::dynamic_smem(), pipe, role);
    }
    if constexpr (!decltype(role)::kComputes) return true;  // the producer: loads only

    const bf16_t* H = static_cast<const bf16_t*>(p.H);
    bf16_t* dH = static_cast<bf16_t*>(p.dH);
    bf16_t* hg = static_cast<bf16_t*>(p.hg);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
      sa.load(H + row0, G * N, t.rows, cols, threadIdx.x, Cfg::THREADS);
      if constexpr (G == 2) sb.load(H + row0 + N, G * N, t.rows, cols, threadIdx.x, Cfg::THREADS);
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
      if (threadIdx.x < Cfg::THREADS)
#pragma unroll
      for (int mt = 0; mt < Cfg::MT; ++mt)
        // The row loop stays rolled: one copy of the chunk loop's code instead of two, the
        // pair it reads from each accumulator block picked by selects (the accumulators stay
        // in registers). Measured 3-5% faster on the persistent tile (bench/NOTES.md v1.0);
        // not through the instruction cache: ncu's no-instruction stalls are ~1% either way.
#pragma unroll 1
        for (int half = 0; half < 2; ++half) {
          const int r = warp_m * Cfg::WTM + mt * 16 + (lane >> 2) + half * 8;
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
    if (!VEC && threadIdx.x < Cfg::THREADS)  // a warp-specialised tile's producer holds no accumulators
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; ++mt)
#pragma unroll 1  // rolled, as the 16-byte path's (the pair picked by selects)
      for (int half = 0; half < 2; ++half) {
        const int r = warp_m * Cfg::WTM + mt * 16 + (lane >> 2) + half * 8;
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
    if (threadIdx.x < Cfg::THREADS) gemm::consumer_sync<Cfg>();
    if constexpr (STAGED) {  // dA, dB over the tile's H rows, hg: whole 16-byte chunks
      sa.store(dH + row0, G * N, t.rows, cols, threadIdx.x, Cfg::THREADS);
      if constexpr (G == 2) sb.store(dH + row0 + N, G * N, t.rows, cols, threadIdx.x, Cfg::THREADS);
      sh.store(hg + static_cast<i64>(t.slot0) * hg_ld + (t.n0 - hg_col0), hg_ld, t.rows, cols, threadIdx.x,
               Cfg::THREADS);
    }
    for (int r = threadIdx.x; r < t.rows; r += Cfg::THREADS) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < Cfg::WARPS_N; ++w) s += red_s[r][w];
      p.gate_partials[static_cast<i64>(t.slot0 + r) * N_TILES + t.n_tile] = s;
    }
    return true;
  });
}

// ---- backward: weight gradients ----------------------------------------------------------
// Bytes of one weight-gradient element for a GradOutput.
MB_DEV int grad_bytes(int grad_output) { return grad_output == static_cast<int>(GradOutput::add_f32) ? 4 : 2; }

template <class Cfg, class RowOut>
MB_DEV void store_wgrad(const float (&acc)[1][Cfg::MT][Cfg::NT][4], int m_valid, int n_valid,
                        int n0, int grad_output, RowOut row_out) {
  gemm::for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
    if (r >= m_valid || c >= n_valid) return;
    void* row = row_out(r);
    if (grad_output == static_cast<int>(GradOutput::add_f32)) {
      float* o = static_cast<float*>(row) + n0 + c;
      o[0] += v0;
      o[1] += v1;
    } else if (grad_output == static_cast<int>(GradOutput::add_bf16)) {
      // Each output element belongs to one thread of one tile: a plain read-add-write.
      bf16_t* o = static_cast<bf16_t*>(row) + n0 + c;
      const float2 old = load_bf16x2(o);
      store_bf16x2(o, old.x + v0, old.y + v1);
    } else {
      store_bf16x2(static_cast<bf16_t*>(row) + n0 + c, v0, v1);
    }
  });
}

// dW2_e = sum over slots of gather(dy)^T (g h): M = D, N = N, both operands gathered along k.
// A column chunk (n_cols > 0) computes dW2 columns [n_col0, +n_cols) from that chunk of hg.
template <class Cfg, int E, int D, int N>
MB_DEV void down_wgrad(const WgradArgs& p) {
  const int n_cols = p.n_cols > 0 ? p.n_cols : N, col0 = p.n_cols > 0 ? p.n_col0 : 0;
  const int b_ld = p.n_cols > 0 ? p.b_ld : N;
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::WgradTile w = gemm::wgrad_tile<Cfg::BM, Cfg::BN, E, D, N, Cfg::SWAP>(tile, p.rv, n_cols);
    if (!w.valid) {
      if constexpr (decltype(role)::kComputes) gemm::tma_store_drain<Cfg>();
      return false;
    }
    const bf16_t* dy = static_cast<const bf16_t*>(p.a);
    const bf16_t* hg = static_cast<const bf16_t*>(p.b);
    const gemm::Rows a{dy + w.m0, p.rv.expert_token_indices + w.slot0, w.count, D, D - w.m0};
    const gemm::Rows b{hg + static_cast<i64>(w.slot0) * b_ld + w.n0, nullptr, w.count, b_ld, n_cols - w.n0};
    float acc[1][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA) {  // hg's slot rows by TMA (the expert's last partial stage: cp.async)
      const gemm::TmaMnRows<gemm::Rows> bt{&p.tma_b, w.n0, w.slot0, w.count, b};
      gemm::run_mainloop<Cfg, false, false>(acc, a, bt, w.count, gemm::dynamic_smem(), pipe, role);
    } else {
      gemm::run_mainloop<Cfg, false, false>(acc, a, b, w.count, gemm::dynamic_smem(), pipe, role);
    }
    if constexpr (!decltype(role)::kComputes) return true;  // the producer: loads only
    if constexpr (Cfg::TSTORE) {  // bf16 gradients: staged, stored by TMA (tma_out0: this chunk's columns)
      if (p.grad_output == static_cast<int>(GradOutput::store_bf16)) {
        gemm::tma_store_tile<Cfg>(acc, gemm::StoreTarget{&p.tma_out0, w.m0, w.n0, w.expert});
        return true;
      }
    }
    const int elem = grad_bytes(p.grad_output);
    char* out = static_cast<char*>(p.out0);
    store_wgrad<Cfg>(acc, D - w.m0, n_cols - w.n0, col0 + w.n0, p.grad_output, [&](int r) -> void* {
      return out + ((static_cast<i64>(w.expert) * D + w.m0 + r) * N) * elem;
  });
  return true;
  });
}

// [dW1_e; dW3_e] = [dA|dB]^T gather(x): M = G*N rows of dH, N = D.
template <class Cfg, int E, int D, int N, Activation ACT, int W_ROWS>
MB_DEV void up_wgrad(const WgradArgs& p) {
  constexpr int G = gate_parts<ACT>();
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::WgradTile w = gemm::wgrad_tile<Cfg::BM, Cfg::BN, E, G * N, D, Cfg::SWAP>(tile, p.rv);
    if (!w.valid) {
      if constexpr (decltype(role)::kComputes) gemm::tma_store_drain<Cfg>();
      return false;
    }
    const bf16_t* dH = static_cast<const bf16_t*>(p.a);
    const bf16_t* x = static_cast<const bf16_t*>(p.b);
    const gemm::Rows a{dH + static_cast<i64>(w.slot0) * (G * N) + w.m0, nullptr, w.count, G * N, G * N - w.m0};
    const gemm::Rows b{x + w.n0, p.rv.expert_token_indices + w.slot0, w.count, D, D - w.n0};
    float acc[1][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA) {  // dH's slot rows by TMA (the expert's last partial stage: cp.async)
      const gemm::TmaMnRows<gemm::Rows> at{&p.tma_a, w.m0, w.slot0, w.count, a};
      gemm::run_mainloop<Cfg, false, false>(acc, at, b, w.count, gemm::dynamic_smem(), pipe, role);
    } else {
      gemm::run_mainloop<Cfg, false, false>(acc, a, b, w.count, gemm::dynamic_smem(), pipe, role);
    }
    if constexpr (!decltype(role)::kComputes) return true;  // the producer: loads only
    if constexpr (Cfg::TSTORE) {  // stored bf16 gradients: staged, stored by TMA into dW1 or dW3
      // A tile straddling dW1 | dW3 (n % BM != 0: one per expert and column of tiles) keeps
      // the direct stores below: its dW3 part would start at a negative row of dW3's map, and
      // TMA stores at negative coordinates stopped the GPU with an illegal instruction (run 9
      // call 1; partial boxes at the far edges store fine: tstore_small_cols, call 2).
      const bool straddles = G == 2 && w.m0 < N && w.m0 + Cfg::BM > N;
      if (p.grad_output == static_cast<int>(GradOutput::store_bf16) && !straddles) {
        const bool dw3 = w.m0 >= N;
        gemm::tma_store_tile<Cfg>(acc, gemm::StoreTarget{dw3 ? &p.tma_out1 : &p.tma_out0, dw3 ? w.m0 - N : w.m0,
                                                         w.n0, w.expert});
        return true;
      }
    }
    const int elem = grad_bytes(p.grad_output);
    char* out0 = static_cast<char*>(p.out0);
    char* out1 = static_cast<char*>(p.out1);
    store_wgrad<Cfg>(acc, G * N - w.m0, D - w.n0, w.n0, p.grad_output, [&](int r) -> void* {
      const int m = w.m0 + r;
      char* base = m < N ? out0 : out1;
      const int row = m < N ? m : m - N;
      return base + ((static_cast<i64>(w.expert) * W_ROWS + row) * D) * elem;
  });
  return true;
  });
}

// ---- backward: up-projection dgrad ---------------------------------------------------------
// dx per slot = [dA|dB] [W1_e; W3_e] (one GEMM, reduction G*N); token sums come after.
template <class Cfg, int E, int D, int N, Activation ACT, int W_ROWS>
MB_DEV void up_dgrad(const UpDgradArgs& p) {
  constexpr int G = gate_parts<ACT>();
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::SlotTile t = gemm::slot_tile<Cfg::BM, Cfg::BN, E, D, Cfg::SWAP>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets);
    if (!t.valid) return false;
    const bf16_t* dH = static_cast<const bf16_t*>(p.dH);
    const i64 w_off = static_cast<i64>(t.expert) * W_ROWS * D + t.n0;
    const gemm::Rows a{dH + static_cast<i64>(t.slot0) * (G * N), nullptr, t.rows, G * N, G * N};
    const gemm::TwoPartRows b{static_cast<const bf16_t*>(p.w1) + w_off,
                              G == 2 ? static_cast<const bf16_t*>(p.w3) + w_off : nullptr,
                              N, N, G == 2 ? N : 0, D, D - t.n0};
    float acc[1][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA) {  // dH rows of the tile; W1_e then W3_e k rows (N % 64 == 0)
      const gemm::TmaRows<1> at{{&p.tma_dh}, t.slot0};
      gemm::TmaMnWeights<G> bt;
      bt.map[0] = &p.tma_w1;
      if constexpr (G == 2) bt.map[G - 1] = &p.tma_w3;
      bt.row_base = t.expert * W_ROWS;
      bt.split = N;
      bt.col0 = t.n0;
      gemm::run_mainloop<Cfg, true, false>(acc, at, bt, G * N, gemm::dynamic_smem(), pipe, role);
    } else {
      gemm::run_mainloop<Cfg, true, false>(acc, a, b, G * N, gemm::dynamic_smem(), pipe, role);
    }
    if constexpr (!decltype(role)::kComputes) return true;  // the producer: loads only
    bf16_t* dxs = static_cast<bf16_t*>(p.dxs);
    gemm::for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
      const int col = t.n0 + c;
      if (r < t.rows && col < D) store_bf16x2(dxs + static_cast<i64>(t.slot0 + r) * D + col, v0, v1);
  });
  return true;
  });
}

}  // namespace moeblaze
