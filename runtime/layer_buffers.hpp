// The byte layouts of the buffers a layer call uses (runtime/moe_layer.hpp MemoryPlan): what
// forward keeps for backward (SavedLayout) and the two calls' scratch. Internal to the
// runtime: plan_memory sizes them, forward/backward place their arrays with them.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "moe_layer.hpp"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::detail {

constexpr size_t kAlign = 256;
constexpr int kIndexSlotsPerBlock = 2048;  // index_build.cuh SLOTS_PER_BLOCK

inline size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int padded_experts(int e) { return (e + 7) / 8 * 8; }

// Appends aligned regions to a buffer layout.
struct Layout {
  size_t total = 0;
  size_t add(size_t bytes) {
    const size_t at = total;
    total += align_up(bytes);
    return at;
  }
};

// Byte offsets of everything forward keeps for backward.
struct SavedLayout {
  size_t eti, eto, tei, tim, tile_prefix, counts, status, H = 0, total, index_bytes;
  SavedLayout(const LayerConfig& l, int64_t T, CheckpointMode mode) {
    const int64_t TK = T * l.shape.topk;
    const int E = l.shape.experts;
    Layout b;
    eti = b.add(TK * 4);
    eto = b.add((E + 1) * 4);
    tei = b.add(TK * 4);
    tim = b.add(TK * 4);
    tile_prefix = b.add(kTilePrefixRows * (E + 1) * 4);
    counts = b.add(E * 4);
    status = b.add(4);
    index_bytes = b.total;
    if (mode == CheckpointMode::save_h) H = b.add(static_cast<size_t>(TK) * l.gate_parts() * l.shape.ffn * 2);
    total = b.total;
  }
};

struct ForwardScratch {
  size_t logits = 0, gates = 0, block_counts, block_offsets, h, o, total;
  int index_blocks;
  int64_t chunk_slots;  // slots per forward chunk (h holds one chunk)
  ForwardScratch(const LayerConfig& l, int64_t T) {
    const int64_t TK = T * l.shape.topk;
    chunk_slots = ceil_div(TK, forward_chunks(l));
    const int E = l.shape.experts;
    index_blocks = static_cast<int>(ceil_div(TK, kIndexSlotsPerBlock));
    Layout b;
    if (l.router != RouterKind::none) {
      logits = b.add(static_cast<size_t>(T) * E * 4);
      gates = b.add(TK * 4);
    }
    block_counts = b.add(static_cast<size_t>(E) * index_blocks * 4);
    block_offsets = b.add(static_cast<size_t>(E) * index_blocks * 4);
    h = b.add(static_cast<size_t>(chunk_slots) * l.shape.ffn * 2);
    o = b.add(static_cast<size_t>(TK) * l.shape.hidden * 2);
    total = b.total;
  }
};

// Backward scratch. dH = [dA|dB] is written over H (save-h: the saved H, which the backward
// consumes; recompute: the recomputed H): the down-dgrad epilogue reads each H element and
// writes the dH element at the same place from the same thread, and nothing reads H after it
// (the down wgrad takes hg). That saves T*K*G*n*2 bytes of peak (1.8 GiB on mixtral-8x7b).
struct BackwardScratch {
  int hg_cols;  // columns of hg: one backward column chunk (backward_chunk_cols)
  size_t H = 0, hg, partials, dxs, logits = 0, ids = 0, gates = 0, d_gates = 0, d_logits = 0, total;
  size_t router_parts, union_bytes;  // the router weight gradient's split parts (router_wgrad_splits)
  BackwardScratch(const LayerConfig& l, int64_t T, CheckpointMode mode, int dgrad_bn) {
    const int64_t TK = T * l.shape.topk;
    const int E = l.shape.experts, G = l.gate_parts(), n = l.shape.ffn, d = l.shape.hidden;
    const int64_t n_tiles = ceil_div(n, dgrad_bn);
    Layout b;
    if (mode == CheckpointMode::recompute) H = b.add(static_cast<size_t>(TK) * G * n * 2);
    // hg and the gate partials die (down wgrad, gate grad) before dxs is written (up dgrad).
    Layout u;
    hg_cols = backward_chunk_cols(l);
    hg = u.add(static_cast<size_t>(TK) * hg_cols * 2);
    partials = u.add(static_cast<size_t>(TK) * n_tiles * 4);
    union_bytes = std::max(u.total, align_up(static_cast<size_t>(TK) * d * 2));
    const size_t union_at = b.add(union_bytes);
    hg += union_at;
    partials += union_at;
    dxs = union_at;
    router_parts = union_at;  // between the gate grad and the up dgrad the region is free
    if (l.router != RouterKind::none) {
      logits = b.add(static_cast<size_t>(T) * E * 4);
      ids = b.add(TK * 4);
      gates = b.add(TK * 4);
      d_gates = b.add(TK * 4);
      d_logits = b.add(static_cast<size_t>(T) * padded_experts(E) * 2);
    }
    total = b.total;
  }
};

// Parts of the router weight gradient's reduction over tokens (router.cuh wgrad_gemm): enough
// blocks for one wave (kRouterWgradBlocks, a constant so that the sums, and so the bits of
// dW_r, are the same on every GPU), at least kRouterWgradMinTokens tokens a part, and fp32
// parts [splits][E][d] that fit in `room` bytes. Every part is non-empty: the kernel cuts the
// tokens into ranges of span = ceil(T / splits) rounded up to `bk`, and (splits - 1) * span < T.
constexpr int kRouterWgradBlocks = 128;
constexpr int64_t kRouterWgradMinTokens = 512;
inline int router_wgrad_splits(int64_t T, int E, int d, int bm, int bn, int bk, size_t room) {
  const int64_t tiles = ceil_div(padded_experts(E), bm) * ceil_div(d, bn);
  int64_t s = std::max<int64_t>(1, kRouterWgradBlocks / tiles);
  s = std::min(s, std::max<int64_t>(1, T / kRouterWgradMinTokens));
  s = std::min<int64_t>(s, room / (static_cast<size_t>(E) * d * 4));
  while (s > 1) {
    const int64_t span = ceil_div(ceil_div(T, s), bk) * bk;
    const int64_t used = ceil_div(T, span);
    if (used == s) break;
    s = used;
  }
  return static_cast<int>(std::max<int64_t>(1, s));
}

}  // namespace moeblaze::detail
