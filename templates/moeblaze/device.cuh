// Device vocabulary shared by every kernel template: bf16 conversions, the device assert,
// warp reductions, the swizzled shared-memory tile layout. Compiled by NVRTC only.
#pragma once
#include <cuda_bf16.h>

#include "moeblaze/common.cuh"
#include "moeblaze/ptx/cp_async.cuh"

namespace moeblaze {

typedef __nv_bfloat16 bf16_t;

#define MB_INFINITY __int_as_float(0x7f800000)

MB_DEV float bf2f(bf16_t v) { return __bfloat162float(v); }
MB_DEV bf16_t f2bf(float v) { return __float2bfloat16_rn(v); }

MB_DEV void store_bf16x2(bf16_t* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
MB_DEV float2 load_bf16x2(const bf16_t* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// Device-side invariant check: a broken invariant stops the kernel (the host sees
// CUDA_ERROR_ILLEGAL_INSTRUCTION) instead of writing garbage.
#define MB_DEVICE_ASSERT(cond) \
  do {                         \
    if (!(cond)) __trap();     \
  } while (0)

// ---- warp helpers --------------------------------------------------------------------
MB_DEV float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
MB_DEV float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- swizzled shared-memory tiles ----------------------------------------------------
// A [ROWS][COLS] bf16 tile with COLS a multiple of 64 (128-byte groups). The 16-byte
// chunk index is XORed with (row & 7), so the 8 row addresses of one ldmatrix phase
// (same logical chunk, 8 consecutive rows) land in 8 different bank groups.
template <int COLS>
MB_DEV int swizzle(int row, int col) {
  static_assert(COLS % 64 == 0, "swizzled tiles need 128-byte row groups");
  return row * COLS + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// The same tile with its columns in blocks of 64: block b holds columns [64b, 64b+64) of every
// row as a [ROWS][64] swizzled tile. This is the MN-major 128-byte-swizzle layout of wgmma
// (8-row atoms of 1024 bytes; the next 64 columns one block further).
template <int ROWS>
MB_DEV int swizzle_blocked(int row, int col) {
  return (col >> 6) * (ROWS * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

}  // namespace moeblaze
