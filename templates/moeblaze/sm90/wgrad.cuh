// The weight gradients on the kernel layer: per expert, dW_e = A^T B summed over the expert's
// slots (a reduction of ceil(count / 64) k steps, zero for an expert without slots), both
// operands MN-major: one gathered along the slots (a token's row of dy or x, cp.async by the
// producer warpgroup), the other the slots' rows of an activation by TMA through a ragged map
// (dH, hg: rows past the expert read zeros). Tiles are numbered expert by expert
// (gemm::wgrad_tile); the epilogue stores or adds (epilogue_wgrad.cuh). In a cluster pair (along
// M) the two blocks share the TMA operand's stages (multicast), each gathering its own rows.
//   down_wgrad:    dW2_e [d][n] = gather(dy)^T hg       A = dy (gathered), B = hg (TMA)
//   gate_up_wgrad: [dW1_e; dW3_e] [G n][d] = dH^T gather(x)   A = dH (TMA), B = x (gathered);
//                  a tile straddling dW1 and dW3 goes to both in 64-row pieces (epilogue_wgrad.cuh)
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
  static MB_DEV WgradOutput epilogue(const Args& p, const gemm::WgradTile& t, int) {
    return {&p.tma_out0, nullptr, t.expert, t.m0, Cfg::BM, 0, t.n0, p.grad_output};
  }
};

template <class Cfg, int E, int D, int N, Activation ACT, bool ALT_ORDER>
struct GateUpWgradProblem : WgradSchedule<Cfg, E, gate_parts<ACT>() * N, D, ALT_ORDER> {
  using Args = WgradArgs;
  // Where n is not a multiple of BM some row tiles straddle dW1 | dW3: 64-row pieces (n % 64 == 0
  // there: the generator's legality, generator/kernel_layer.cpp).
  static constexpr bool STRADDLES = gate_parts<ACT>() == 2 && N % Cfg::BM != 0;
  static_assert(!STRADDLES || N % 64 == 0, "a straddling tile's 64-row pieces each inside one matrix");
  using Epilogue = WgradEpilogue<Cfg, STRADDLES ? 64 : Cfg::BM>;
  static MB_DEV auto operands(const Args& p, const gemm::WgradTile& t) {
    const GatherColsMN x{static_cast<const Element*>(p.b), p.rv.expert_token_indices + t.slot0, t.count, D, t.n0, D};
    return sm90::operands(TmaRaggedColsMN{&p.tma_a, t.slot0, t.count, t.m0}, x, (t.count + 63) / 64);
  }
  // Rows [m0, +BM) of [dW1; dW3]: those before n to dW1 from row m0, the rest to dW3 from row
  // m0 + split - n (0 for a straddling tile).
  static MB_DEV WgradOutput epilogue(const Args& p, const gemm::WgradTile& t, int) {
    const bool in_w1 = t.m0 < N;
    if (!in_w1) return {&p.tma_out1, nullptr, t.expert, t.m0 - N, Cfg::BM, 0, t.n0, p.grad_output};
    return {&p.tma_out0, STRADDLES ? &p.tma_out1 : nullptr, t.expert, t.m0, N - t.m0, 0, t.n0, p.grad_output};
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
