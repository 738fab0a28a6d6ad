// Gradients of the per-expert biases (GPT-OSS): d_bias_up[e] = sum over the expert's slots of
// dH (the biases were added to A and B before H was stored), d_bias_down[e] = sum over its
// slots of g * dy, and the bias part of the gate gradient, <dy_t, bias_down[e]> (o includes the
// bias). Memory-bound reductions with a fixed order (no atomics): bitwise reproducible.
#pragma once
#include "moeblaze/device.cuh"
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/slot_gate.cuh"

namespace moeblaze {

constexpr int kBiasGradThreads = 256;  // one column per thread; the generator launches this many

MB_DEV void store_bias_grad(void* out, i64 at, float v, int grad_output) {
  if (grad_output == static_cast<int>(GradOutput::add_f32)) {
    static_cast<float*>(out)[at] += v;
  } else {
    bf16_t* o = static_cast<bf16_t*>(out) + at;
    *o = f2bf(grad_output == static_cast<int>(GradOutput::add_bf16) ? bf2f(*o) + v : v);
  }
}

// Blocks [0, E * ceil(G*N / 256)): a 256-column chunk of d_bias_up of one expert; the blocks
// after them: a 256-column chunk of d_bias_down. Each thread sums one column over the expert's
// slots in order (coalesced row reads across the block).
template <int E, int K, int D, int N, int G>
MB_DEV void bias_grad(const BiasGradArgs& p) {
  constexpr int UP_CHUNKS = (G * N + kBiasGradThreads - 1) / kBiasGradThreads;
  constexpr int DOWN_CHUNKS = (D + kBiasGradThreads - 1) / kBiasGradThreads;
  const int b = blockIdx.x;
  const bool up = b < E * UP_CHUNKS;
  const int e = up ? b / UP_CHUNKS : (b - E * UP_CHUNKS) / DOWN_CHUNKS;
  if (e >= E) return;
  const int chunk = up ? b % UP_CHUNKS : (b - E * UP_CHUNKS) % DOWN_CHUNKS;
  const int col = chunk * kBiasGradThreads + threadIdx.x;
  const int slot0 = p.rv.expert_token_offsets[e], slot1 = p.rv.expert_token_offsets[e + 1];
  float s = 0.f;
  if (up) {
    if (col >= G * N) return;
    const bf16_t* dH = static_cast<const bf16_t*>(p.dH);
    for (int slot = slot0; slot < slot1; ++slot) s += bf2f(dH[static_cast<i64>(slot) * (G * N) + col]);
    store_bias_grad(p.d_bias_up, static_cast<i64>(e) * (G * N) + col, s, p.grad_output);
  } else {
    if (col >= D) return;
    const bf16_t* dy = static_cast<const bf16_t*>(p.dy);
    for (int slot = slot0; slot < slot1; ++slot) {
      const i64 t = p.rv.expert_token_indices[slot];
      s += slot_gate<K>(p.rv, slot) * bf2f(dy[t * D + col]);
    }
    store_bias_grad(p.d_bias_down, static_cast<i64>(e) * D + col, s, p.grad_output);
  }
}

// One warp per slot (token-major, 8 warps a block): a fixed-order dot product over d.
template <int E, int K, int D>
MB_DEV void gate_bias_grad(const GateBiasGradArgs& p) {
  const int lane = threadIdx.x & 31;
  const i64 slot = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (slot >= p.slots) return;
  const i64 t = slot / K;
  const int e = p.token_expert_indices[slot];
  if (e < 0 || e >= E) return;  // kLeftOutSlot: left out by the index build (gate_grad wrote its 0)
  const bf16_t* dy = static_cast<const bf16_t*>(p.dy) + t * D;
  const bf16_t* b = static_cast<const bf16_t*>(p.bias_down) + static_cast<i64>(e) * D;
  float s = 0.f;
  for (int c = lane; c < D; c += 32) s += bf2f(dy[c]) * bf2f(b[c]);
  s = warp_sum(s);
  if (lane == 0) p.d_gates[slot] += s;
}

}  // namespace moeblaze
