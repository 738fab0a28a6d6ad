// Kernel argument structs, shared by the host launcher and the device templates.
// Only plain types: pointers are untyped (bf16 data is __nv_bfloat16 on the device and
// moeblaze::bf16 on the host; same bits). Every kernel takes exactly one of these by value.
#pragma once
#include "moeblaze/common.cuh"

namespace moeblaze {

// The routing view every expert kernel reads (docs/design.md "Index arrays") and the tile schedule.
struct RoutingView {
  const int* expert_token_indices;  // [T*K]
  const int* expert_token_offsets;  // [E+1]
  const int* token_expert_indices;  // [T*K]
  const int* token_index_map;       // [T*K]
  const int* tile_prefix;           // [3][E+1]: exclusive prefix of ceil(count/BM), BM = 64,128,256
  const float* gates;               // [T*K] token-major gate of each slot
  i64 tokens;                       // T
};

// Index of the tile-prefix row for a block height (64 -> 0, 128 -> 1, 256 -> 2).
MB_HD constexpr int tile_prefix_row(int bm) { return bm == 64 ? 0 : bm == 128 ? 1 : 2; }
constexpr int kTilePrefixRows = 3;

// Upper bound of blocks for a grid tiled over expert slots (rows) and n_out (columns):
// the sum over experts of ceil(count/BM) is at most ceil(T*K/BM) + E.
MB_HD constexpr i64 slot_tile_blocks(i64 slots, int bm, int bn, int experts, int n_out) {
  return ((slots + bm - 1) / bm + experts) * ((n_out + bn - 1) / bn);
}

// ---- routing -------------------------------------------------------------------------
struct RouterTopkArgs {
  const float* logits;  // [T,E] fp32
  const float* bias;    // [E] or nullptr (sigmoid router)
  float route_scale;
  i64 tokens;
  int* topk_ids;        // [T*K] out
  float* topk_weights;  // [T*K] out
};

struct RouterBackwardArgs {
  const float* logits;        // [T,E] fp32, recomputed in backward
  const int* topk_ids;        // [T*K]
  const float* d_topk_weights;  // [T*K]
  float route_scale;
  i64 tokens;
  void* d_logits;             // [T,E_pad] bf16 out (columns E..E_pad written as 0)
};

struct IndexBuildArgs {
  const int* topk_ids;     // [T*K]
  i64 tokens;
  int blocks;              // blocks of the count/scatter kernels
  int* block_counts;       // [blocks][E] scratch
  int* block_offsets;      // [blocks][E] scratch
  int* expert_token_indices;
  int* expert_token_offsets;
  int* token_expert_indices;
  int* token_index_map;
  int* tile_prefix;        // [3][E+1]
  int* expert_counts;      // [E] router statistics out (tokens per expert)
  int* status;             // one word, RoutingStatus
};

// ---- expert GEMMs ------------------------------------------------------------------------
// A TMA tensor map (CUtensorMap: 128 opaque bytes; CUDA 13 aligns it to 128), encoded by the host
// (runtime/tma.cpp) for tiles that load an operand with cp.async.bulk.tensor. The kernel
// takes its argument struct as a __grid_constant__ parameter, so the map's address is the
// parameter's own (the PTX ISA requires param, const or global memory for a tensor map).
struct alignas(128) TmaMap {
  unsigned long long opaque[16];
};

struct GateUpArgs {      // forward and backward-recompute up-projection
  RoutingView rv;
  const void* x;         // [T,d]
  const void* w1;        // [E,n,d]
  const void* w3;        // [E,n,d] (gated only)
  void* H;               // [T*K, G*n] saved pre-activations [A|B], or nullptr
  void* h;               // [T*K, n] activations for the down-projection, or nullptr
  TmaMap tma_w1, tma_w3;  // TMA tiles only: W1, W3 as [E*n, d], box [BN rows][64 k]
  int slot_lo, slot_hi;   // slot_hi > 0: only the slots [slot_lo, slot_hi) (a forward chunk);
                          // h holds their rows from row 0 (h row = slot - slot_lo)
  const void* bias;       // BIAS layers: [E, G*n] bf16, [gate | up] per expert, added before H
  // Kernel-layer tiles (_cute): ragged views (runtime/tma.hpp RaggedMapParams) of H's gate (A)
  // and up (B) columns [T*K][n] (rows G*n apart) and of h [rows of the h buffer][n].
  TmaMap tma_H_gate, tma_H_up, tma_h_out;
};

struct DownProjArgs {
  RoutingView rv;
  const void* h;         // [T*K, n]
  const void* w2;        // [E,d,n]
  void* o;               // [T*K, d] expert outputs (gate applied in the combine)
  TmaMap tma_w2;         // TMA tiles only: W2 as [E*d, n], box [BN rows][64 k]
  int slot_lo, slot_hi;  // slot_hi > 0: only the slots [slot_lo, slot_hi); h row = slot - slot_lo
  TmaMap tma_h;          // TMA tiles only: h as [rows of the h buffer, n], box [BM rows][64 k]
  const void* bias;      // BIAS layers: [E, d] bf16, added to o
  TmaMap tma_o;          // TMA-store tiles only: o as [1][T*K][d], box [1][BM][64]; kernel-layer tiles
                         // (_cute): a ragged view of o (runtime/tma.hpp RaggedMapParams)
};

struct CombineArgs {     // y_t = sum_j g_tj * rows[token_index_map[t,j]]; also dx gather-sum
  const int* token_index_map;
  const float* gates;    // [T*K] or nullptr for an unweighted sum
  const void* rows;      // [T*K, d]
  i64 tokens;
  void* out;             // [T,d] bf16
  int add_to_out;        // 1: out += the sum (the token gradient onto the router's part of dx)
};

struct DownDgradArgs {
  RoutingView rv;
  const void* dy;        // [T,d]
  const void* w2;        // [E,d,n]
  const void* H;         // [T*K, G*n]
  void* dH;              // [T*K, G*n] out: [dA|dB]; the runtime passes H itself (in place:
                         // each thread reads its H elements before it writes them)
  void* hg;              // [T*K, n] out: gate * h (input of the down wgrad)
  float* gate_partials;  // [T*K, n_tiles] out: per-tile parts of <dy W2, h>
  int n_tile_lo, n_tiles;  // n_tiles > 0: only N tiles [n_tile_lo, +n_tiles) (a backward column
                           // chunk); hg then holds their columns, rows hg_ld apart
  int hg_ld;
  TmaMap tma_w2;           // TMA tiles only: W2 as [E*d, n], boxes [64 k][64 columns]
  // Kernel-layer tiles (_cute): ragged views (runtime/tma.hpp RaggedMapParams) of H's and dH's
  // gate (A) and up (B) columns [T*K][n] (rows G*n apart), and of hg's columns of this launch's
  // chunk [T*K][chunk] (rows hg_ld apart).
  TmaMap tma_H_gate, tma_H_up, tma_dH_gate, tma_dH_up, tma_hg_out;
};

struct GateGradArgs {
  const int* token_index_map;
  const float* gate_partials;  // [T*K, n_tiles]
  i64 slots;
  float* d_topk_weights;       // [T*K] out, token-major
};

struct WgradArgs {       // dW = sum over an expert's slots of A^T B (both gathered along k)
  RoutingView rv;
  const void* a;         // down: dy [T,d];  up: dH [T*K, G*n]
  const void* b;         // down: hg [T*K,n]; up: x [T,d]
  void* out0;            // down: dW2 [E,d,n]; up: dW1 [E,n,d]
  void* out1;            // up gated: dW3 [E,n,d]
  int grad_output;       // GradOutput: bf16 stores, or results added into fp32 / bf16 buffers
  int n_col0, n_cols;    // down wgrad, n_cols > 0: only dW2 columns [n_col0, +n_cols), whose hg
  int b_ld;              // (a column chunk of down_dgrad's) has rows b_ld apart
  TmaMap tma_a, tma_b;   // TMA tiles only: up wgrad's dH as [T*K, G*n]; down wgrad's hg as
                         // [T*K, n_cols] (rows b_ld apart); boxes [64 slots][64 columns]
  TmaMap tma_out0, tma_out1;  // "_tmastore" tiles only: the outputs as [E][rows][cols], box
                              // [1][BM][64] (down: dW2's columns [n_col0, +n_cols); up: dW1, dW3)
};

struct GateUpDgradArgs {
  RoutingView rv;
  const void* dH;        // [T*K, G*n]
  const void* w1;
  const void* w3;
  void* dxs;             // [T*K, d] per-slot dx
  TmaMap tma_dh;         // TMA tiles only: dH as [T*K, G*n], box [BM rows][64 k]
  TmaMap tma_w1, tma_w3;  // TMA tiles only: W1, W3 as [E*n, d], boxes [64 k][64 columns]
  TmaMap tma_dxs;        // TMA-store tiles only: dxs as [1][T*K][d], box [1][BM][64]
};

// ---- expert biases (BIAS layers) -----------------------------------------------------------
struct BiasGradArgs {    // per-expert column sums over the expert's slots, in slot order
  RoutingView rv;
  const void* dH;        // [T*K, G*n] (after down_dgrad): d_bias_up[e] = sum of the slots' dH rows
  const void* dy;        // [T,d]: d_bias_down[e] = sum of the slots' g * dy rows
  void* d_bias_up;       // [E, G*n] out
  void* d_bias_down;     // [E, d] out
  int grad_output;       // GradOutput, as the weight gradients
};

struct GateBiasGradArgs {  // d_gates[t,j] += <dy_t, bias_down[e_tj]>: o's bias part of dL/dg
  const int* token_expert_indices;  // [T*K]
  const void* dy;                   // [T,d]
  const void* bias_down;            // [E,d]
  i64 slots;                        // T*K
  float* d_gates;                   // [T*K] token-major, added to
};

// ---- router GEMMs (dense, one group) ------------------------------------------------------
struct RouterGemmArgs {
  const void* x;         // [T,d]
  const void* w_router;  // [E,d]
  const void* d_logits;  // [T,E_pad] bf16 (backward)
  i64 tokens;
  void* out;             // logits: [T,E] fp32; dgrad: dx [T,d] bf16; wgrad: dW_r [E,d]
  int accumulate_fp32;   // wgrad: 1 adds into an fp32 dW_r
  // wgrad with its reduction over tokens split in `splits` parts (router_wgrad_splits): pass 0
  // writes each part's fp32 tile to partials [splits][E][d], pass 1 sums them in part order.
  float* partials;
  int splits;
  int pass;
};

}  // namespace moeblaze
