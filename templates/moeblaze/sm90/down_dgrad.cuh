// down_dgrad on the kernel layer: dh' = gather(dy) W2_e per slot, and its epilogue, the
// activation's backward and the gate gradient's row-dot (epilogue_dact_gate.cuh). A = dy's rows
// of the tile's tokens, gathered by the producer warpgroup; B = W2_e's k rows (d) of the N
// tile's columns (n), MN-major by TMA ([64][64] boxes of the [E*d, n] map).
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/sm90/epilogue_dact_gate.cuh"
#include "moeblaze/sm90/gemm_kernel.cuh"
#include "moeblaze/sm90/slot_tiles.cuh"

namespace moeblaze::sm90 {

template <class Cfg, int E, int K, int D, int N, Activation ACT, bool ALT_ORDER>
struct DownDgradProblem {
  using Args = DownDgradArgs;
  using Mainloop = sm90::Mainloop<Cfg, true>;
  using Epilogue = DactGateEpilogue<Cfg, K, N, ACT>;
  static constexpr bool K_STEPS_FIXED = true;
  static_assert(D % 64 == 0, "W2_e's k stages stay inside its d rows");

  // A backward column chunk (n_tiles > 0) walks its N tiles only.
  static MB_DEV gemm::SlotTile problem_tile(const Args& p, int index, int rank) {
    return slot_pair_tile<Cfg, Cfg::BN, E, N, ALT_ORDER>(p.rv, index, rank, 0, 0, p.n_tiles, p.n_tile_lo);
  }
  static MB_DEV int k_tiles(const Args&, const gemm::SlotTile&) { return D / 64; }
  static MB_DEV auto operands(const Args& p, const gemm::SlotTile& t) {
    const GatherRowsK dy{static_cast<const Element*>(p.dy), p.rv.expert_token_indices + t.slot0, t.rows, D, D};
    return sm90::operands(dy, TmaColsMN{{&p.tma_w2, &p.tma_w2}, t.expert * D, D, t.n0}, k_tiles(p, t));
  }
  static MB_DEV typename Epilogue::Params epilogue(const Args& p, const gemm::SlotTile& t, int thread_idx) {
    const int hg_col0 = p.n_tiles > 0 ? p.n_tile_lo * Cfg::BN : 0;
    typename Epilogue::Params e{{&p.tma_H_gate, &p.tma_H_up}, {&p.tma_dH_gate, &p.tma_dH_up}, &p.tma_hg_out,
                                p.gate_partials, t.n0, t.slot0, t.rows, t.n0 - hg_col0, t.n_tile, {}};
    Epilogue::prepare(e, p.rv, thread_idx);
    return e;
  }
};

template <class Cfg, int E, int K, int D, int N, Activation ACT, bool ALT_ORDER>
MB_DEV void down_dgrad(const DownDgradArgs& p) {
  gemm_kernel<Cfg, DownDgradProblem<Cfg, E, K, D, N, ACT, ALT_ORDER>>(p);
}

}  // namespace moeblaze::sm90
