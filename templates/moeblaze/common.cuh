// moeblaze common header: included by every kernel template (under NVRTC) and by the
// host library (under the host compiler), so that enums and kernel argument structs are
// spelled once. Keep it free of any header: NVRTC compiles it without a C library.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define MB_DEVICE_COMPILE 1
#define MB_HD __host__ __device__
#define MB_DEV __device__ __forceinline__
#else
#define MB_DEVICE_COMPILE 0
#define MB_HD
#endif

namespace moeblaze {

typedef long long i64;

// Expert activation. The gated ones (swiglu, geglu, clamped_swiglu) use two up matrices W1
// (gate) and W3 (up): h = act(x W1^T) * up(x W3^T), up(b) = b. The plain ones use W1 alone:
// h = act(x W1^T). gelu is the tanh approximation everywhere (host reference included).
// clamped_swiglu is GPT-OSS's: act(a) = a' sigmoid(alpha a') with a' = min(a, limit), and
// up(b) = clamp(b, -limit, limit) + 1, alpha = 1.702, limit = 7 (kClampedSwigluAlpha/Limit).
enum class Activation : int { swiglu = 0, geglu = 1, silu = 2, gelu = 3, relu = 4, clamped_swiglu = 5 };

constexpr float kClampedSwigluAlpha = 1.702f;
constexpr float kClampedSwigluLimit = 7.f;

MB_HD constexpr bool is_gated(Activation a) {
  return a == Activation::swiglu || a == Activation::geglu || a == Activation::clamped_swiglu;
}

// How W1 and W3 are stored. separate: two [E,n,d] tensors. fused_gate_up: one [E,2n,d]
// tensor holding each expert's W1 rows, then its W3 rows (the gate_up_proj of Hugging Face
// MoE models): W3 starts n rows after W1 and both step 2n rows from expert to expert. Their
// gradients are written in the same layout. Gated activations only.
enum class WeightLayout : int { separate = 0, fused_gate_up = 1 };

// How the weight-gradient GEMMs write dW. store_bf16 overwrites a bf16 gradient; add_f32 adds
// into an fp32 buffer (a trainer's main gradient); add_bf16 adds into the bf16 gradient already
// there (gradient accumulation over micro-batches, with no separate add kernel).
enum class GradOutput : int { store_bf16 = 0, add_f32 = 1, add_bf16 = 2 };

// Built-in router. none: the caller passes topk ids and weights.
// softmax_topk: p = softmax(x W_r^T); pick the K largest p; gate = p (optionally
//   renormalised over the K picks), times route_scale.
// sigmoid_topk: s = sigmoid(x W_r^T); pick the K largest s + bias; gate = s
//   (optionally renormalised), times route_scale (DeepSeek-V3 style).
enum class RouterKind : int { none = 0, softmax_topk = 1, sigmoid_topk = 2 };

// Error codes the index build leaves in the layer's status word (0 = fine). Written by
// a plain store from any thread that sees the fault; the host reads it on request.
enum RoutingStatus : int {
  routing_ok = 0,
  routing_id_out_of_range = 1,
  routing_duplicate_expert = 2,
};

// What the index build writes into token_index_map and token_expert_indices for a slot whose
// id is outside [0, E): the slot is left out (no expert holds it, so no GEMM and no tile
// schedule sees it), and every token-major reader skips it: it adds nothing to y or dx and its
// gate gradient is 0.
constexpr int kLeftOutSlot = -1;

// The mainloop of a GEMM tile: the generator's TileConfig::mainloop and gemm::Tile's MAINLOOP_
// (gemm/tile.cuh). The glossary of docs/design.md gives each its tile-name suffix and template.
//   mma_sync          mma.sync warps, one cp.async pipeline shared by all warps
//   wgmma_multistage  wgmma warpgroups sharing one cp.async pipeline
//   warp_specialized  a producer warpgroup loads, consumer warpgroups run wgmma; a tile per block
//   persistent        the same, persistent: blocks walk the tile schedule, the consumers
//                     splitting each tile's rows (cooperative)
//   pingpong          persistent, two consumer warpgroups on alternate tiles
// gemm::Tile takes it as an int template argument (the generated glue writes
// int(moeblaze::Mainloop::persistent)), so the number is what the kernels' mangled names hold.
enum class Mainloop : int { mma_sync = 0, wgmma_multistage = 1, warp_specialized = 2, persistent = 3, pingpong = 4 };

MB_HD constexpr bool uses_wgmma(Mainloop m) { return m != Mainloop::mma_sync; }
// A producer warpgroup feeds the consumers (every wgmma mainloop but the multistage one).
MB_HD constexpr bool is_warp_specialized(Mainloop m) {
  return m == Mainloop::warp_specialized || m == Mainloop::persistent || m == Mainloop::pingpong;
}
// Blocks walk the tile schedule (ping-pong is persistent too).
MB_HD constexpr bool is_persistent(Mainloop m) { return m == Mainloop::persistent || m == Mainloop::pingpong; }

// The GPU target kernels are compiled for (KernelSpec::arch, NVRTC's --gpu-architecture). Its
// text form, "sm_90a" (generator/kernel_spec.hpp to_string / parse_arch), is what the binary
// cache keys hold. sm_90a is Hopper with its architecture-specific features (wgmma,
// setmaxnreg), which every tile kind but mma_sync needs. Any other value is the SM number of a
// target without them (86: sm_86, a GPU that runs the mma.sync tiles only).
enum class Arch : int { sm_90a = 90 };

MB_HD constexpr bool has_wgmma(Arch a) { return a == Arch::sm_90a; }

}  // namespace moeblaze
