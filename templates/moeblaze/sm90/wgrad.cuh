// The weight gradients on the kernel layer: per expert, dW_e = A^T B summed over the expert's
// slots (a reduction of ceil(count / 64) k steps, zero for an expert without slots), both
// operands MN-major: one gathered along the slots (a token's row of dy or x, cp.async by the
// producer warpgroup), the other the slots' rows of an activation by TMA through a ragged map
// (dH, hg: rows past the expert read zeros). Tiles are numbered expert by expert
// (gemm::wgrad_tile); the epilogue stores or adds (epilogue_wgrad.cuh). In a cluster pair (along
// M) the two blocks share the TMA operand's stages (multicast), each gathering its own rows.
//   down_wgrad:    dW2_e [d][n] = gather(dy)^T hg       A = dy (gathered), B = hg (TMA)
//   gate_up_wgrad: [dW1_e; dW3_e] [G n][d] = dH^T gather(x)   A = dH (TMA), B = x (gathered);
//                  a tile straddling dW1 and dW3 goes to both (epilogue_wgrad.cuh)
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/gemm/scheduler/tile_schedule.cuh"
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/sm90/epilogue_wgrad.cuh"
#include "moeblaze/sm90/gemm_kernel.cuh"

namespace moeblaze::sm90 {

template <class Cfg, int E, int M, int N_OUT, bool ALT_ORDER>
struct WgradSchedule {
  using Args = WgradArgs;
  using Mainloop = sm90::Mainloop<Cfg, true>;
  using Epilogue = WgradEpilogue<Cfg>;
  static constexpr bool K_STEPS_FIXED = false;

  // down_wgrad's column chunks (n_cols > 0) have N_OUT = n_cols columns. A cluster pair's tile
  // is 2 BM rows of one expert and N tile (the same k steps for both blocks, the B stages
  // shared): the block of `rank` computes rows [m0 + rank BM, +BM); a half past M loads its
  // share of B and stores nothing (the output map clips its rows).
  static MB_DEV gemm::WgradTile problem_tile(const Args& p, int index, int rank) {
    auto t = gemm::wgrad_tile<Cfg::BM * Cfg::CLUSTER_M, Cfg::BN, E, M, N_OUT, ALT_ORDER>(index, p.rv,
                                                                                       p.n_cols > 0 ? p.n_cols : N_OUT);
    t.m0 += rank * Cfg::BM;
    return t;
  }
  static MB_DEV int k_tiles(const Args&, const gemm::WgradTile& t) { return (t.count + 63) / 64; }
};

template <class Cfg, int E, int D, int N, bool ALT_ORDER>
struct DownWgradProblem : WgradSchedule<Cfg, E, D, N, ALT_ORDER> {
  using Args = WgradArgs;
  static MB_DEV auto operands(const Args& p, const gemm::WgradTile& t) {
    const GatherColsMN dy{static_cast<const Element*>(p.a), p.rv.expert_token_indices + t.slot0, t.count, D, t.m0, D};
    return sm90::operands(dy, TmaRaggedColsMN{&p.tma_b, t.slot0, t.count, t.n0}, (t.count + 63) / 64);
  }
  static MB_DEV typename WgradEpilogue<Cfg>::Params epilogue(const Args& p, const gemm::WgradTile& t, int) {
    return {&p.tma_out0, nullptr, t.expert, t.m0, 0, t.n0, p.grad_output};
  }
};

template <class Cfg, int E, int D, int N, Activation ACT, bool ALT_ORDER>
struct GateUpWgradProblem : WgradSchedule<Cfg, E, gate_parts<ACT>() * N, D, ALT_ORDER> {
  using Args = WgradArgs;
  static MB_DEV auto operands(const Args& p, const gemm::WgradTile& t) {
    const GatherColsMN x{static_cast<const Element*>(p.b), p.rv.expert_token_indices + t.slot0, t.count, D, t.n0, D};
    return sm90::operands(TmaRaggedColsMN{&p.tma_a, t.slot0, t.count, t.m0}, x, (t.count + 63) / 64);
  }
  // Rows [m0, +BM) of [dW1; dW3]: dW1's from m0 (its map clips rows past n), dW3's from m0 - n
  // (rows before its first are clipped) where the tile reaches them.
  static MB_DEV typename WgradEpilogue<Cfg>::Params epilogue(const Args& p, const gemm::WgradTile& t, int) {
    constexpr int G = gate_parts<ACT>();
    const bool in_w1 = t.m0 < N, in_w3 = G == 2 && t.m0 + Cfg::BM > N;
    return {in_w1 ? &p.tma_out0 : &p.tma_out1, in_w1 && in_w3 ? &p.tma_out1 : nullptr, t.expert,
            in_w1 ? t.m0 : t.m0 - N, t.m0 - N, t.n0, p.grad_output};
  }
};

template <class Cfg, int E, int D, int N, bool ALT_ORDER>
MB_DEV void down_wgrad(const WgradArgs& p) {
  gemm_kernel<Cfg, DownWgradProblem<Cfg, E, D, N, ALT_ORDER>>(p);
}
template <class Cfg, int E, int D, int N, Activation ACT, bool ALT_ORDER>
MB_DEV void gate_up_wgrad(const WgradArgs& p) {
  gemm_kernel<Cfg, GateUpWgradProblem<Cfg, E, D, N, ACT, ALT_ORDER>>(p);
}

}  // namespace moeblaze::sm90
