// Expert activations and their derivatives, as the epilogues apply them (gelu = the tanh
// approximation, as the host reference).
#pragma once
#include <cuda_bf16.h>
#include "moeblaze/common.cuh"
#include "moeblaze/ptx/math.cuh"

namespace moeblaze {

// Up matrices of an activation: 2 for the gated ones ([A|B] = x [W1; W3]^T side by side), else 1.
template <Activation ACT>
constexpr int gate_parts() { return is_gated(ACT) ? 2 : 1; }

// The logistic function without an IEEE division. An IEEE divide (div.rn / rcp.rn) is ~10
// instructions plus a call to its slow path per element, and the epilogues apply the
// activation unrolled over a whole tile (down_dgrad: 128 elements a thread, two divides
// each, each a dependent chain: rcp, Newton steps, the slow-path test): the persistent
// down_dgrad's epilogue ran ~70k cycles a tile for ~15k of work, and 19% faster without them
// (the dependent chains, not the instruction cache: ncu's no-instruction stalls are ~1%).
// The outputs are bf16 (8 bits of mantissa): the approximate reciprocal's error does not reach them.
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

// The activation's backward at one element of down_dgrad's epilogue (both the hand-written and the
// kernel layer's): dh' value d, gate g, the saved pre-activations a (and b, gated) -> dA, dB
// (gated; else 0) and h = act(a) [* up(b)].
template <Activation ACT, int G>
MB_DEV void act_bwd_element(float a, float b, float d, float g, float& da, float& db, float& h) {
  float s, ds;
  act_fwd_grad<ACT>(a, s, ds);
  if constexpr (G == 2) {
    const float u = act_up<ACT>(b);
    h = s * u;
    da = g * d * u * ds;
    db = g * d * s * act_up_grad<ACT>(b);
  } else {
    h = s;
    da = g * d * ds;
    db = 0.f;
  }
}

}  // namespace moeblaze
