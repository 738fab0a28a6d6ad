// The gate of one expert slot, looked up token-major: the slot's token picks `expert` exactly
// once (the index build rejects duplicates). Shared by the expert GEMMs and the bias gradients.
#pragma once
#include "moeblaze/device.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze {

template <int K>
MB_DEV float slot_gate(const RoutingView& rv, int slot, int expert) {
  const i64 t = rv.expert_token_indices[slot];
  float g = 0.f;
#pragma unroll
  for (int j = 0; j < K; ++j)
    if (rv.token_expert_indices[t * K + j] == expert) g = rv.gates[t * K + j];
  return g;
}

}  // namespace moeblaze
