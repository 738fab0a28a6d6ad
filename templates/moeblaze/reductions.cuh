// Token-major gather-sums through token_index_map: the combine (y_t = sum_j g_tj o_tj),
// the token gradient (dx_t += sum_j dx_slot, onto the router's part) and the gate-gradient reduction. Each output
// element is summed by one thread in a fixed order: no atomics, bitwise reproducible.
// A left-out slot (kLeftOutSlot: its id was outside [0, E)) has no row: the sums skip it (its
// gate is never read, so even a NaN gate there changes nothing) and its gate gradient is 0.
#pragma once
#include "moeblaze/device.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::reductions {

constexpr int COMBINE_THREADS = 128;

// One block per token, 8 columns (16 bytes) per thread and step.
template <int D, int K>
MB_DEV void combine(const CombineArgs& p) {
  static_assert(D % 8 == 0, "rows are read 16 bytes at a time");
  const i64 t = blockIdx.x;
  if (t >= p.tokens) return;
  int pos[K];
  float g[K];
#pragma unroll
  for (int j = 0; j < K; ++j) {
    pos[j] = p.token_index_map[t * K + j];
    g[j] = p.gates ? p.gates[t * K + j] : 1.f;
  }
  const bf16_t* rows = static_cast<const bf16_t*>(p.rows);
  bf16_t* out = static_cast<bf16_t*>(p.out) + t * D;
  for (int c = threadIdx.x * 8; c < D; c += COMBINE_THREADS * 8) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (p.add_to_out) {  // the slot sum added after what is there, in the same order every run
      const uint4 v = *reinterpret_cast<const uint4*>(out + c);
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h2[i]);
        acc[2 * i] = f.x;
        acc[2 * i + 1] = f.y;
      }
    }
#pragma unroll
    for (int j = 0; j < K; ++j) {
      if (pos[j] == kLeftOutSlot) continue;  // the same for the whole block: no divergence
      const uint4 v = *reinterpret_cast<const uint4*>(rows + static_cast<i64>(pos[j]) * D + c);
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h2[i]);
        acc[2 * i] += g[j] * f.x;
        acc[2 * i + 1] += g[j] * f.y;
      }
    }
    uint4 o;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) o2[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    *reinterpret_cast<uint4*>(out + c) = o;
  }
}

// d_topk_weights[t,j] = sum over N tiles of the down-dgrad partials of slot (t,j).
template <int N_TILES>
MB_DEV void gate_grad(const GateGradArgs& p) {
  const i64 s = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= p.slots) return;
  const int pos = p.token_index_map[s];
  if (pos == kLeftOutSlot) {
    p.d_topk_weights[s] = 0.f;
    return;
  }
  const float* part = p.gate_partials + static_cast<i64>(pos) * N_TILES;
  float v = 0.f;
#pragma unroll 4
  for (int i = 0; i < N_TILES; ++i) v += part[i];
  p.d_topk_weights[s] = v;
}

}  // namespace moeblaze::reductions
