// The up-projection's epilogue: the gate and up pre-activations [A|B] of a slot tile (plus the
// expert's biases, BIAS layers), rounded to bf16, saved as H (when the checkpoint mode keeps it)
// and turned into h = act(A) * up(B) (act(A) for plain activations) for the down-projection.
#pragma once
#include "moeblaze/activation.cuh"
#include "moeblaze/gemm/fragment.cuh"
#include "moeblaze/gemm/scheduler/tile_schedule.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::gemm {

// H rows are G*N wide ([A|B]); h rows (N wide) start at slot p.slot_lo (a forward chunk's first).
// BIAS: p.bias [E, G*N] ([gate | up] per expert) is added before H is stored, so that the
// backward's H (and its dH) are those of the biased pre-activations.
template <class Cfg, int N, Activation ACT, bool BIAS>
MB_DEV void store_gate_up(const float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const SlotTile& t, const GateUpArgs& p) {
  constexpr int G = gate_parts<ACT>();
  bf16_t* H = static_cast<bf16_t*>(p.H);
  bf16_t* h = static_cast<bf16_t*>(p.h);
  auto store = [&](int r, int c, float a0, float a1, float b0, float b1) {
    const int col = t.n0 + c;
    if (r >= t.rows || col >= N) return;
    const i64 slot = t.slot0 + r;
    if constexpr (BIAS) {  // col is even: 4-byte loads
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
}

}  // namespace moeblaze::gemm
