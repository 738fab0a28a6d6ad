// The gate of one expert slot (a position in expert_token_indices), looked up token-major:
// the token's pick whose token_index_map entry is this position. Matching by position rather
// than by expert id finds exactly this slot's gate even where a token picks one expert twice
// (reported by the index build, but computed as two slots), and never a left-out slot's
// (kLeftOutSlot is no position). Shared by the expert GEMMs and the bias gradients.
#pragma once
#include "moeblaze/device.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze {

template <int K>
MB_DEV float slot_gate(const RoutingView& rv, int slot) {
  const i64 t = rv.expert_token_indices[slot];
  float g = 0.f;
#pragma unroll
  for (int j = 0; j < K; ++j)
    if (rv.token_index_map[t * K + j] == slot) g = rv.gates[t * K + j];
  return g;
}

}  // namespace moeblaze
