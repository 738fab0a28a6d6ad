// Accumulators regrouped so that each lane holds 8 consecutive columns of a row: the epilogues
// that read and write global memory straight from registers (persistent tiles, whose shared
// memory holds the next tile's stages) then move 16 bytes per access instead of 4.
//
// The mma/wgmma accumulator layout gives lane q of a quad (lane & 3) columns 8 nt + 2q and
// 8 nt + 2q + 1 of its row for every n8 block nt. Over four consecutive blocks the quad holds
// a 4 x 4 matrix of such pairs, M[q][i] = lane q's pair of block base + i; its transpose
// T[q][i] = M[i][q] is lane q's whole block base + q, pairs in column order.
#pragma once
#include "moeblaze/device.cuh"

namespace moeblaze::gemm {

// In place, x[i] = this lane's pair of block base + i  ->  x[i] = pair i of block base + q.
// Two butterfly rounds (lanes q ^ 2, then q ^ 1) of two pairs each; every lane of the warp
// must call it (shuffles).
MB_DEV void quad_transpose(float (&x)[4][2], int lane) {
  const bool hi = lane & 2, lo = lane & 1;
  // Round 1: swap the pairs whose index differs from the lane in bit 1.
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float s0 = hi ? x[0][e] : x[2][e], s1 = hi ? x[1][e] : x[3][e];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 2), r1 = __shfl_xor_sync(0xffffffffu, s1, 2);
    if (hi) { x[0][e] = r0; x[1][e] = r1; } else { x[2][e] = r0; x[3][e] = r1; }
  }
  // Round 2: the same in bit 0.
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float s0 = lo ? x[0][e] : x[1][e], s1 = lo ? x[2][e] : x[3][e];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    if (lo) { x[0][e] = r0; x[2][e] = r1; } else { x[1][e] = r0; x[3][e] = r1; }
  }
}

// 8 bf16 <-> float, as one 16-byte word.
MB_DEV void unpack8(const uint4& w, float (&v)[8]) {
  const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(u[i] << 16);
    v[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
MB_DEV uint4 pack8(const float (&v)[8]) {
  unsigned u[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    u[i] = *reinterpret_cast<const unsigned*>(&b);
  }
  return make_uint4(u[0], u[1], u[2], u[3]);
}

}  // namespace moeblaze::gemm
