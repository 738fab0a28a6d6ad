// Device vocabulary shared by every kernel template: bf16 conversions, cp.async,
// ldmatrix, mma.sync, warp reductions, the swizzled shared-memory tile layout.
// Compiled by NVRTC only.
#pragma once
#include <cuda_bf16.h>

#include "moeblaze/common.cuh"

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

// ---- activations (gelu = tanh approximation, as the host reference) -----------------
// 1/x by the SFU (rcp.approx: within 1 ulp), for x >= 1 here (no denormal inputs; inf -> 0).
MB_DEV float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}
// The logistic function without an IEEE division. An IEEE divide (div.rn / rcp.rn) is ~10
// instructions plus a call to its slow path per element, and the epilogues apply the
// activation unrolled over a whole tile (down_dgrad: 128 elements a thread, two divides
// each, each a dependent chain: rcp, Newton steps, the slow-path test): the persistent
// down_dgrad's epilogue ran ~70k cycles a tile for ~15k of work, and 19% faster without them
// (bench/NOTES.md v0.9; v1.0: not through the instruction cache, as first read). The outputs are
// bf16 (8 bits of mantissa): the approximate reciprocal's error does not reach them.
// Large |a|: exp(-a) = inf gives 0, exp(-a) = 0 gives 1.
MB_DEV float sigmoid(float a) { return rcp_approx(1.f + __expf(-a)); }

template <Activation ACT>
MB_DEV float act_fwd(float a) {
  if constexpr (ACT == Activation::clamped_swiglu) {
    a = fminf(a, kClampedSwigluLimit);
    return a * sigmoid(kClampedSwigluAlpha * a);
  } else if constexpr (ACT == Activation::swiglu || ACT == Activation::silu) {
    return a * sigmoid(a);
  } else if constexpr (ACT == Activation::geglu || ACT == Activation::gelu) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    return 0.5f * a * (1.f + tanhf(k0 * (a + k1 * a * a * a)));
  } else {
    return a > 0.f ? a : 0.f;
  }
}
template <Activation ACT>
MB_DEV float act_grad(float a) {
  if constexpr (ACT == Activation::clamped_swiglu) {
    // min(a, limit) passes the gradient up to and including the limit (torch.clamp's rule).
    const float s = sigmoid(kClampedSwigluAlpha * a);
    return a > kClampedSwigluLimit ? 0.f : s * (1.f + kClampedSwigluAlpha * a * (1.f - s));
  } else if constexpr (ACT == Activation::swiglu || ACT == Activation::silu) {
    const float s = sigmoid(a);  // shared with act_fwd's (the compiler merges the two)
    return s * (1.f + a * (1.f - s));
  } else if constexpr (ACT == Activation::geglu || ACT == Activation::gelu) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    float u = k0 * (a + k1 * a * a * a);
    float th = tanhf(u);
    return 0.5f * (1.f + th) + 0.5f * a * (1.f - th * th) * k0 * (1.f + 3.f * k1 * a * a);
  } else {
    return a > 0.f ? 1.f : 0.f;
  }
}

// act(a) and act'(a) together. The clamped SwiGLU's two share one sigmoid (of alpha min(a, L):
// where a > L the derivative is 0 anyway); computed apart they took two, and the persistent
// down_dgrad epilogue spilled.
template <Activation ACT>
MB_DEV void act_fwd_grad(float a, float& f, float& df) {
  if constexpr (ACT == Activation::clamped_swiglu) {
    const float m = fminf(a, kClampedSwigluLimit);
    const float s = sigmoid(kClampedSwigluAlpha * m);
    f = m * s;
    df = a > kClampedSwigluLimit ? 0.f : s * (1.f + kClampedSwigluAlpha * m * (1.f - s));
  } else {
    f = act_fwd<ACT>(a);
    df = act_grad<ACT>(a);
  }
}

// The up (W3) factor of a gated activation and its derivative: b and 1, or GPT-OSS's
// clamp(b, -limit, limit) + 1 (gradient inside the closed interval).
template <Activation ACT>
MB_DEV float act_up(float b) {
  if constexpr (ACT == Activation::clamped_swiglu)
    return fminf(fmaxf(b, -kClampedSwigluLimit), kClampedSwigluLimit) + 1.f;
  else
    return b;
}
template <Activation ACT>
MB_DEV float act_up_grad(float b) {
  if constexpr (ACT == Activation::clamped_swiglu)
    return b >= -kClampedSwigluLimit && b <= kClampedSwigluLimit ? 1.f : 0.f;
  else
    return 1.f;
}

// ---- async copies and tensor-core fragments ------------------------------------------
MB_DEV unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16-byte global->shared copy; when !valid it writes 16 zero bytes and reads nothing.
MB_DEV void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
}
MB_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
MB_DEV void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
MB_DEV void ldsm_x4(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}
MB_DEV void ldsm_x4_trans(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}
// D += A(16x16, row) * B(16x8, col), bf16 in, fp32 accumulate.
MB_DEV void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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
