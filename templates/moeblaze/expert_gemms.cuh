// The expert GEMMs of the layer (docs/design.md), each a grouped GEMM over experts with its
// gather fused into the operand load and its elementwise work fused into the epilogue. Each
// kernel is the same three pieces: a tile schedule (gemm/scheduler/), the mainloop the tile
// config asks for (gemm/mainloop.cuh) fed by row sources (gemm/rows.cuh, TMA sources in
// gemm/tma_loaders.cuh), and its epilogue (gemm/epilogue/, one file each).
// Shape parameters are compiled in: E experts, K picks, D model width, N expert width,
// ACT activation. G = 2 for gated activations ([A|B] side by side), else 1. W_ROWS: rows of
// one expert in the W1/W3 storage (and in dW1/dW3): N for two [E,N,D] tensors, 2N for the
// fused gate_up [E,2N,D] (WeightLayout::fused_gate_up; the host passes W3 = W1 + N*D).
// BIAS: per-expert biases (GPT-OSS) on the up-projection (before H) and the down-projection.
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/gemm/epilogue/dact_gate.cuh"
#include "moeblaze/gemm/epilogue/gate_up_act.cuh"
#include "moeblaze/gemm/epilogue/row_store.cuh"
#include "moeblaze/gemm/epilogue/tma_store.cuh"
#include "moeblaze/gemm/epilogue/wgrad_store.cuh"
#include "moeblaze/gemm/mainloop.cuh"
#include "moeblaze/gemm/rows.cuh"
#include "moeblaze/gemm/scheduler/tile_schedule.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze {

// ---- forward: up-projection ------------------------------------------------------------
// Per expert e: [A|B] = gather(x) [W1_e; W3_e]^T, x read once for both matrices.
// Writes H = [A|B] (when saved) and h = act(A) * up(B) (when the down-projection needs it).
template <class Cfg, int E, int D, int N, Activation ACT, int W_ROWS, bool BIAS>
MB_DEV void gate_up(const GateUpArgs& p) {
  constexpr int G = gate_parts<ACT>();
  static_assert(Cfg::NB == G, "gated activations stack W1 and W3 tiles");
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::SlotTile pair =
        p.slot_hi > 0
            ? gemm::chunk_slot_tile<Cfg::BM * Cfg::CLUSTER, Cfg::BN, E, N, Cfg::ALT_ORDER>(tile, p.rv.expert_token_offsets, p.slot_lo, p.slot_hi)
            : gemm::slot_tile<Cfg::BM * Cfg::CLUSTER, Cfg::BN, E, N, Cfg::ALT_ORDER>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets);
    if (!pair.valid) return false;
    const gemm::SlotTile t = gemm::cluster_half<Cfg>(pair);
    const bf16_t* x = static_cast<const bf16_t*>(p.x);
    const i64 w_off = (static_cast<i64>(t.expert) * W_ROWS + t.n0) * D;
    const int n_rows = N - t.n0 < Cfg::BN ? N - t.n0 : Cfg::BN;
    const gemm::Rows a{x, p.rv.expert_token_indices + t.slot0, t.rows, D, D};
    float acc[Cfg::NB][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA_CONTIGUOUS) {  // W1/W3 rows [e*W_ROWS + n0, +BN) of the maps (rows past N: unused columns)
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

    gemm::store_gate_up<Cfg, N, ACT, BIAS>(acc, t, p);
    return true;
  });
}

// ---- forward: down-projection ------------------------------------------------------------
// o = h W2_e^T (+ the expert's bias) per slot (expert-major order); the gate is applied by the
// combine.
template <class Cfg, int E, int D, int N, bool BIAS>
MB_DEV void down_proj(const DownProjArgs& p) {
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::SlotTile pair =
        p.slot_hi > 0
            ? gemm::chunk_slot_tile<Cfg::BM * Cfg::CLUSTER, Cfg::BN, E, D, Cfg::ALT_ORDER>(tile, p.rv.expert_token_offsets, p.slot_lo, p.slot_hi)
            : gemm::slot_tile<Cfg::BM * Cfg::CLUSTER, Cfg::BN, E, D, Cfg::ALT_ORDER>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets);
    if (!pair.valid) {
      if constexpr (decltype(role)::kConsumer) gemm::tma_store_drain<Cfg>();
      return false;
    }
    const gemm::SlotTile t = gemm::cluster_half<Cfg>(pair);
    const bf16_t* h = static_cast<const bf16_t*>(p.h);
    const bf16_t* w2 = static_cast<const bf16_t*>(p.w2);
    const gemm::Rows a{h + static_cast<i64>(t.slot0 - p.slot_lo) * N, nullptr, t.rows, N, N};
    float acc[1][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA_CONTIGUOUS) {  // W2 rows [e*D + n0, +BN) of the [E*D, N] map; h rows of the
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
    gemm::store_slot_tile<Cfg, D, BIAS>(acc, static_cast<bf16_t*>(p.o), &p.tma_o, t, p.bias);
    return true;
  });
}

// ---- backward: down-projection dgrad -------------------------------------------------------
// dh' = gather(dy) W2_e; its epilogue (gemm/epilogue/dact_gate.cuh) is the activation's backward
// and the gate gradient's row-dot.
template <class Cfg, int E, int K, int D, int N, Activation ACT>
MB_DEV void down_dgrad(const DownDgradArgs& p) {
  constexpr int G = gate_parts<ACT>();
  // One-tile wgmma blocks stage the epilogue's H tile and its results through the stage
  // buffers the mainloop is done with ((G+1) BM x BN tiles: 96 KiB at 128x128 s3, 192 KiB at
  // 128x256 s4); persistent blocks' producers are filling them with the next tile already.
  constexpr bool STAGED = Cfg::WGMMA && !Cfg::PERSISTENT && (G + 1) * Cfg::BM * Cfg::BN <= Cfg::STAGES * Cfg::STAGE_ELEMS;
  // One copy per consumer group: ping-pong groups run the epilogues of different tiles.
  __shared__ float gate_s[Cfg::CONSUMER_GROUPS][Cfg::BM];
  __shared__ float red_s[Cfg::CONSUMER_GROUPS][Cfg::BM][Cfg::WARPS_N];
  const int hg_ld = p.n_tiles > 0 ? p.hg_ld : N, hg_col0 = p.n_tiles > 0 ? p.n_tile_lo * Cfg::BN : 0;
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::SlotTile pair =
        p.n_tiles > 0 ? gemm::slot_tile_cols<Cfg::BM * Cfg::CLUSTER, Cfg::BN, E, Cfg::ALT_ORDER>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets,
                                                                  p.n_tiles, p.n_tile_lo)
                      : gemm::slot_tile<Cfg::BM * Cfg::CLUSTER, Cfg::BN, E, N, Cfg::ALT_ORDER>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets);
    if (!pair.valid) return false;
    const gemm::SlotTile t = gemm::cluster_half<Cfg>(pair);
    const bf16_t* dy = static_cast<const bf16_t*>(p.dy);
    const bf16_t* w2 = static_cast<const bf16_t*>(p.w2);
    const gemm::Rows a{dy, p.rv.expert_token_indices + t.slot0, t.rows, D, D};
    const gemm::Rows b{w2 + static_cast<i64>(t.expert) * D * N + t.n0, nullptr, D, N, N - t.n0};
    float acc[1][Cfg::MT][Cfg::NT][4];
    // Computing threads only (THREADS >= BM): the gates are visible to every consumer after
    // the mainloop's barrier (__syncthreads, or the consumer barrier ws_consume starts with).
    if constexpr (decltype(role)::kComputes) gemm::load_tile_gates<Cfg, K>(p.rv, t, gate_s[gemm::consumer_group<Cfg>()]);
    const gemm::PrefetchTileH<Cfg, N, ACT> h_prefetch{p, t};  // the epilogue's H, into L2
    if constexpr (Cfg::TMA_CONTIGUOUS) {  // W2_e's k rows [k0, +64) of the [E*D, N] map (D % 64 == 0)
      const gemm::TmaMnWeights<1> bt{{&p.tma_w2}, t.expert * D, D, t.n0};
      gemm::run_mainloop<Cfg, true, false>(acc, a, bt, D, gemm::dynamic_smem(), pipe, role, h_prefetch);
    } else {
      gemm::run_mainloop<Cfg, true, false>(acc, a, b, D, gemm::dynamic_smem(), pipe, role, h_prefetch);
    }
    if constexpr (!decltype(role)::kComputes) return true;  // the producer: loads only
    const int group = gemm::consumer_group<Cfg>();
    gemm::dact_gate_epilogue<Cfg, N, ACT, STAGED>(acc, p, t, gate_s[group], red_s[group], hg_ld, hg_col0);
    return true;
  });
}

// ---- backward: weight gradients ----------------------------------------------------------
// dW2_e = sum over slots of gather(dy)^T (g h): M = D, N = N, both operands gathered along k.
// A column chunk (n_cols > 0) computes dW2 columns [n_col0, +n_cols) from that chunk of hg.
template <class Cfg, int E, int D, int N>
MB_DEV void down_wgrad(const WgradArgs& p) {
  const int n_cols = p.n_cols > 0 ? p.n_cols : N, col0 = p.n_cols > 0 ? p.n_col0 : 0;
  const int b_ld = p.n_cols > 0 ? p.b_ld : N;
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::WgradTile w = gemm::wgrad_tile<Cfg::BM, Cfg::BN, E, D, N, Cfg::ALT_ORDER>(tile, p.rv, n_cols);
    if (!w.valid) {
      if constexpr (decltype(role)::kConsumer) gemm::tma_store_drain<Cfg>();  // both ping-pong groups
      return false;
    }
    const bf16_t* dy = static_cast<const bf16_t*>(p.a);
    const bf16_t* hg = static_cast<const bf16_t*>(p.b);
    const gemm::Rows a{dy + w.m0, p.rv.expert_token_indices + w.slot0, w.count, D, D - w.m0};
    const gemm::Rows b{hg + static_cast<i64>(w.slot0) * b_ld + w.n0, nullptr, w.count, b_ld, n_cols - w.n0};
    float acc[1][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA_CONTIGUOUS) {  // hg's slot rows by TMA (the expert's last partial stage: cp.async)
      const gemm::TmaMnRows<gemm::Rows> bt{&p.tma_b, w.n0, w.slot0, w.count, b};
      gemm::run_mainloop<Cfg, false, false>(acc, a, bt, w.count, gemm::dynamic_smem(), pipe, role);
    } else {
      gemm::run_mainloop<Cfg, false, false>(acc, a, b, w.count, gemm::dynamic_smem(), pipe, role);
    }
    if constexpr (!decltype(role)::kComputes) return true;  // the producer: loads only
    if constexpr (Cfg::TMA_STORE) {  // gradients staged and written by TMA (tma_out0: this chunk's columns)
      if (gemm::tma_epilogue<Cfg>(p.grad_output)) {
        gemm::tma_wgrad_tile<Cfg>(acc, gemm::StoreTarget{&p.tma_out0, w.m0, w.n0, w.expert}, p.grad_output);
        return true;
      }
    }
    const int elem = gemm::grad_bytes(p.grad_output);
    char* out = static_cast<char*>(p.out0);
    gemm::store_wgrad<Cfg>(acc, D - w.m0, n_cols - w.n0, col0 + w.n0, p.grad_output, [&](int r) -> void* {
      return out + ((static_cast<i64>(w.expert) * D + w.m0 + r) * N) * elem;
    });
    return true;
  });
}

// [dW1_e; dW3_e] = [dA|dB]^T gather(x): M = G*N rows of dH, N = D.
template <class Cfg, int E, int D, int N, Activation ACT, int W_ROWS>
MB_DEV void gate_up_wgrad(const WgradArgs& p) {
  constexpr int G = gate_parts<ACT>();
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::WgradTile w = gemm::wgrad_tile<Cfg::BM, Cfg::BN, E, G * N, D, Cfg::ALT_ORDER>(tile, p.rv);
    if (!w.valid) {
      if constexpr (decltype(role)::kConsumer) gemm::tma_store_drain<Cfg>();  // both ping-pong groups
      return false;
    }
    const bf16_t* dH = static_cast<const bf16_t*>(p.a);
    const bf16_t* x = static_cast<const bf16_t*>(p.b);
    const gemm::Rows a{dH + static_cast<i64>(w.slot0) * (G * N) + w.m0, nullptr, w.count, G * N, G * N - w.m0};
    const gemm::Rows b{x + w.n0, p.rv.expert_token_indices + w.slot0, w.count, D, D - w.n0};
    float acc[1][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA_CONTIGUOUS) {  // dH's slot rows by TMA (the expert's last partial stage: cp.async)
      const gemm::TmaMnRows<gemm::Rows> at{&p.tma_a, w.m0, w.slot0, w.count, a};
      gemm::run_mainloop<Cfg, false, false>(acc, at, b, w.count, gemm::dynamic_smem(), pipe, role);
    } else {
      gemm::run_mainloop<Cfg, false, false>(acc, a, b, w.count, gemm::dynamic_smem(), pipe, role);
    }
    if constexpr (!decltype(role)::kComputes) return true;  // the producer: loads only
    if constexpr (Cfg::TMA_STORE) {  // gradients staged and written by TMA into dW1 or dW3
      // A tile straddling dW1 | dW3 (n % BM != 0: one per expert and column of tiles) keeps
      // the direct stores below: its dW3 part would start at a negative row of dW3's map, and
      // TMA stores at negative coordinates stopped the GPU with an illegal instruction (partial
      // boxes at the far edges store fine: the ragged-column grad-checks pass).
      const bool straddles = G == 2 && w.m0 < N && w.m0 + Cfg::BM > N;
      if (gemm::tma_epilogue<Cfg>(p.grad_output) && !straddles) {
        const bool dw3 = w.m0 >= N;
        gemm::tma_wgrad_tile<Cfg>(acc, gemm::StoreTarget{dw3 ? &p.tma_out1 : &p.tma_out0, dw3 ? w.m0 - N : w.m0,
                                                         w.n0, w.expert},
                                  p.grad_output);
        return true;
      }
    }
    const int elem = gemm::grad_bytes(p.grad_output);
    char* out0 = static_cast<char*>(p.out0);
    char* out1 = static_cast<char*>(p.out1);
    gemm::store_wgrad<Cfg>(acc, G * N - w.m0, D - w.n0, w.n0, p.grad_output, [&](int r) -> void* {
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
MB_DEV void gate_up_dgrad(const GateUpDgradArgs& p) {
  constexpr int G = gate_parts<ACT>();
  gemm::for_each_tile<Cfg>([&](int tile, auto& pipe, auto role) {
    const gemm::SlotTile pair = gemm::slot_tile<Cfg::BM * Cfg::CLUSTER, Cfg::BN, E, D, Cfg::ALT_ORDER>(tile, p.rv.tile_prefix, p.rv.expert_token_offsets);
    if (!pair.valid) {
      if constexpr (decltype(role)::kConsumer) gemm::tma_store_drain<Cfg>();
      return false;
    }
    const gemm::SlotTile t = gemm::cluster_half<Cfg>(pair);
    const bf16_t* dH = static_cast<const bf16_t*>(p.dH);
    const i64 w_off = static_cast<i64>(t.expert) * W_ROWS * D + t.n0;
    const gemm::Rows a{dH + static_cast<i64>(t.slot0) * (G * N), nullptr, t.rows, G * N, G * N};
    const gemm::TwoPartRows b{static_cast<const bf16_t*>(p.w1) + w_off,
                              G == 2 ? static_cast<const bf16_t*>(p.w3) + w_off : nullptr,
                              N, N, G == 2 ? N : 0, D, D - t.n0};
    float acc[1][Cfg::MT][Cfg::NT][4];
    if constexpr (Cfg::TMA_CONTIGUOUS) {  // dH rows of the tile; W1_e then W3_e k rows (N % 64 == 0)
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
    gemm::store_slot_tile<Cfg, D>(acc, static_cast<bf16_t*>(p.dxs), &p.tma_dxs, t);
    return true;
  });
}

}  // namespace moeblaze
