// Built-in router: logits GEMM, top-K selection with gates, and the backward into the
// logits; plus the two router GEMMs of backward (dx += dlogits W_r, dW_r = dlogits^T x).
// One warp per token for the selection; E (<= 512) scores live in registers.
#pragma once
#include "moeblaze/gemm/mainloop.cuh"
#include "moeblaze/gemm/rows.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::router {

constexpr int WARPS_PER_BLOCK = 8;

MB_HD constexpr int padded_experts(int e) { return (e + 7) / 8 * 8; }

// Scores of one token's experts e = lane + 32*i: p (softmax) or s (sigmoid).
template <int E, RouterKind KIND>
struct TokenScores {
  static constexpr int VPL = (E + 31) / 32;
  float score[VPL];
  float max_logit, sum_exp;  // softmax only

  MB_DEV TokenScores(const float* logits) {
    const int lane = threadIdx.x & 31;
    float l[VPL];
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int e = lane + 32 * i;
      l[i] = e < E ? logits[e] : -MB_INFINITY;
    }
    if constexpr (KIND == RouterKind::softmax_topk) {
      float m = -MB_INFINITY;
#pragma unroll
      for (int i = 0; i < VPL; ++i) m = fmaxf(m, l[i]);
      max_logit = warp_max(m);
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        score[i] = lane + 32 * i < E ? __expf(l[i] - max_logit) : 0.f;
        s += score[i];
      }
      sum_exp = warp_sum(s);
      const float inv = 1.f / sum_exp;
#pragma unroll
      for (int i = 0; i < VPL; ++i) score[i] *= inv;
    } else {
#pragma unroll
      for (int i = 0; i < VPL; ++i) score[i] = lane + 32 * i < E ? 1.f / (1.f + __expf(-l[i])) : 0.f;
    }
  }
};

// A float's order as an unsigned integer (larger float, larger key; -0 and +0 the same key),
// for the warp's integer max reduction. Keys are never NaN (scores are finite or -inf).
MB_DEV unsigned ordered_key(float f) {
  const unsigned u = __float_as_uint(f + 0.f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <int E, int K, RouterKind KIND, bool RENORM>
MB_DEV void topk(const RouterTopkArgs& p) {
  const int lane = threadIdx.x & 31;
  const i64 t = static_cast<i64>(blockIdx.x) * WARPS_PER_BLOCK + (threadIdx.x >> 5);
  if (t >= p.tokens) return;
  const TokenScores<E, KIND> sc(p.logits + t * E);
  constexpr int VPL = TokenScores<E, KIND>::VPL;
  float key[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int e = lane + 32 * i;
    float k = sc.score[i];
    if constexpr (KIND == RouterKind::sigmoid_topk) k += (p.bias && e < E) ? p.bias[e] : 0.f;
    key[i] = e < E ? k : -MB_INFINITY;
  }
  int my_id = 0;
  float my_gate = 0.f, picked_sum = 0.f;
  for (int j = 0; j < K; ++j) {
    float bk = -MB_INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < VPL; ++i)
      if (key[i] > bk) { bk = key[i]; bi = lane + 32 * i; }  // ascending e: ties keep the lower id
    // The warp's largest key, then the lowest id holding it: two redux.sync instead of a
    // five-level butterfly of value and id shuffles. The keys compare as floats do (-0 made +0).
    const unsigned top = __reduce_max_sync(0xffffffffu, ordered_key(bk));
    bi = static_cast<int>(__reduce_min_sync(0xffffffffu, ordered_key(bk) == top ? static_cast<unsigned>(bi) : 0xffffffffu));
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < VPL; ++i)
      if (lane + 32 * i == bi) { s = sc.score[i]; key[i] = -MB_INFINITY; }
    s = __shfl_sync(0xffffffffu, s, bi & 31);
    picked_sum += s;
    if (lane == j) { my_id = bi; my_gate = s; }
  }
  if (RENORM) my_gate /= picked_sum;
  if (lane < K) {
    p.topk_ids[t * K + lane] = my_id;
    p.topk_weights[t * K + lane] = my_gate * p.route_scale;
  }
}

// d logits for one token, selection held fixed (see the reference for the formulas).
template <int E, int K, RouterKind KIND, bool RENORM>
MB_DEV void backward(const RouterBackwardArgs& p) {
  constexpr int EP = padded_experts(E);
  const int lane = threadIdx.x & 31;
  const i64 t = static_cast<i64>(blockIdx.x) * WARPS_PER_BLOCK + (threadIdx.x >> 5);
  if (t >= p.tokens) return;
  const float* lg = p.logits + t * E;
  const TokenScores<E, KIND> sc(lg);
  // Lane j < K holds pick j: its id, its score and dL/dscore.
  int id = 0;
  float s = 0.f, dg = 0.f;
  if (lane < K) {
    id = p.topk_ids[t * K + lane];
    dg = p.d_topk_weights[t * K + lane];
    const float l = lg[id];
    if constexpr (KIND == RouterKind::softmax_topk) s = __expf(l - sc.max_logit) / sc.sum_exp;
    else s = 1.f / (1.f + __expf(-l));
  }
  float ds;
  if constexpr (RENORM) {
    const float S = warp_sum(s);
    const float c = warp_sum(dg * s) / S;
    ds = p.route_scale / S * (dg - c);
  } else {
    ds = p.route_scale * dg;
  }
  if (lane >= K) ds = 0.f;
  float dot = 0.f;
  if constexpr (KIND == RouterKind::softmax_topk) dot = warp_sum(s * ds);
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.d_logits) + t * EP;
  constexpr int VPL = (EP + 31) / 32;
  float dsel[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) dsel[i] = 0.f;
  for (int k = 0; k < K; ++k) {
    const int idk = __shfl_sync(0xffffffffu, id, k);
    const float dk = __shfl_sync(0xffffffffu, ds, k);
#pragma unroll
    for (int i = 0; i < VPL; ++i)
      if (lane + 32 * i == idk) dsel[i] = dk;
  }
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int e = lane + 32 * i;
    if (e >= EP) continue;
    float v = 0.f;
    if (e < E) {
      const float l = lg[e];
      if constexpr (KIND == RouterKind::softmax_topk) {
        const float pe = __expf(l - sc.max_logit) / sc.sum_exp;
        v = pe * (dsel[i] - dot);
      } else {
        const float se = 1.f / (1.f + __expf(-l));
        v = dsel[i] * se * (1.f - se);
      }
    }
    out[e] = f2bf(v);
  }
}

// logits [T,E] fp32 = x W_r^T.
template <class Cfg, int E, int D>
MB_DEV void logits_gemm(const RouterGemmArgs& p) {
  constexpr int TN = (E + Cfg::BN - 1) / Cfg::BN;
  const i64 m0 = static_cast<i64>(blockIdx.x / TN) * Cfg::BM;
  const int n0 = (blockIdx.x % TN) * Cfg::BN;
  const int rows = p.tokens - m0 < Cfg::BM ? static_cast<int>(p.tokens - m0) : Cfg::BM;
  const gemm::Rows a{static_cast<const bf16_t*>(p.x) + m0 * D, nullptr, rows, D, D};
  const gemm::Rows b{static_cast<const bf16_t*>(p.w_router) + static_cast<i64>(n0) * D, nullptr,
                     E - n0 < Cfg::BN ? E - n0 : Cfg::BN, D, D};
  float acc[1][Cfg::MT][Cfg::NT][4];
  gemm::run_mainloop<Cfg, true, true>(acc, a, b, D, gemm::dynamic_smem());
  float* out = static_cast<float*>(p.out);
  gemm::for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
    const int col = n0 + c;
    if (r >= rows) return;
    float* o = out + (m0 + r) * E + col;
    if (col < E) o[0] = v0;
    if (col + 1 < E) o[1] = v1;
  });
}

// dx [T,D] = dlogits [T,EP] W_r [E,D]: stored, and the expert part is added onto it by the
// token-gradient combine (a store here costs half the memory traffic of a read-add-write).
template <class Cfg, int E, int D>
MB_DEV void dgrad_gemm(const RouterGemmArgs& p) {
  constexpr int EP = padded_experts(E);
  constexpr int TN = (D + Cfg::BN - 1) / Cfg::BN;
  const i64 m0 = static_cast<i64>(blockIdx.x / TN) * Cfg::BM;
  const int n0 = (blockIdx.x % TN) * Cfg::BN;
  const int rows = p.tokens - m0 < Cfg::BM ? static_cast<int>(p.tokens - m0) : Cfg::BM;
  const gemm::Rows a{static_cast<const bf16_t*>(p.d_logits) + m0 * EP, nullptr, rows, EP, EP};
  const gemm::Rows b{static_cast<const bf16_t*>(p.w_router) + n0, nullptr, E, D, D - n0};
  float acc[1][Cfg::MT][Cfg::NT][4];
  gemm::run_mainloop<Cfg, true, false>(acc, a, b, EP, gemm::dynamic_smem());
  bf16_t* dx = static_cast<bf16_t*>(p.out);
  gemm::for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
    const int col = n0 + c;
    if (r >= rows || col >= D) return;
    store_bf16x2(dx + (m0 + r) * D + col, v0, v1);
  });
}

// dW_r [E,D] = dlogits^T x, reduced over all T tokens. With p.splits > 1 the reduction is cut
// into that many token ranges (multiples of BK): pass 0 (blocks: tiles x splits) writes each
// range's fp32 tile to p.partials, pass 1 sums the parts in range order, so the result does not
// depend on which block ran first. A 128-row tile over E <= 256 rows has few tiles (qwen3-30b-a3b:
// 8 for 132 SMs), each reducing over every token, without the split.
template <class Cfg, int E, int D>
MB_DEV void wgrad_sum_parts(const RouterGemmArgs& p) {
  constexpr i64 N4 = static_cast<i64>(E) * D / 4;
  static_assert(D % 4 == 0, "float4 parts");
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < N4; i += stride) {
    float4 s = reinterpret_cast<const float4*>(p.partials)[i];
    for (int part = 1; part < p.splits; ++part) {
      const float4 v = reinterpret_cast<const float4*>(p.partials)[part * N4 + i];
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    if (p.accumulate_fp32) {
      float4* o = reinterpret_cast<float4*>(p.out) + i;
      float4 prev = *o;
      prev.x += s.x; prev.y += s.y; prev.z += s.z; prev.w += s.w;
      *o = prev;
    } else {
      bf16_t* o = static_cast<bf16_t*>(p.out) + 4 * i;
      store_bf16x2(o, s.x, s.y);
      store_bf16x2(o + 2, s.z, s.w);
    }
  }
}

template <class Cfg, int E, int D>
MB_DEV void wgrad_gemm(const RouterGemmArgs& p) {
  if (p.pass == 1) return wgrad_sum_parts<Cfg, E, D>(p);
  constexpr int EP = padded_experts(E);
  constexpr int TN = (D + Cfg::BN - 1) / Cfg::BN;
  constexpr int TM = (EP + Cfg::BM - 1) / Cfg::BM;
  const int tile = blockIdx.x % (TM * TN), part = blockIdx.x / (TM * TN);
  const int m0 = (tile / TN) * Cfg::BM;
  const int n0 = (tile % TN) * Cfg::BN;
  const int splits = p.splits > 1 ? p.splits : 1;
  const i64 per_part = (p.tokens + splits - 1) / splits;
  const i64 span = (per_part + Cfg::BK - 1) / Cfg::BK * Cfg::BK;
  const i64 t0 = part * span;
  const int tokens = static_cast<int>((p.tokens - t0 < span ? p.tokens - t0 : span));
  const gemm::Rows a{static_cast<const bf16_t*>(p.d_logits) + t0 * EP + m0, nullptr, tokens, EP, EP - m0};
  const gemm::Rows b{static_cast<const bf16_t*>(p.x) + t0 * D + n0, nullptr, tokens, D, D - n0};
  float acc[1][Cfg::MT][Cfg::NT][4];
  gemm::run_mainloop<Cfg, false, false>(acc, a, b, tokens, gemm::dynamic_smem());
  float* parts = splits > 1 ? p.partials + static_cast<i64>(part) * E * D : nullptr;
  gemm::for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
    const int row = m0 + r, col = n0 + c;
    if (row >= E || col >= D) return;
    const i64 i = static_cast<i64>(row) * D + col;
    if (parts) {
      parts[i] = v0;
      parts[i + 1] = v1;
    } else if (p.accumulate_fp32) {
      float* o = static_cast<float*>(p.out) + i;
      o[0] += v0;
      o[1] += v1;
    } else {
      store_bf16x2(static_cast<bf16_t*>(p.out) + i, v0, v1);
    }
  });
}

}  // namespace moeblaze::router
