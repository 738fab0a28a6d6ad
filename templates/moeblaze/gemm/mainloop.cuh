// The mainloop a tile config asks for (gemm::run_mainloop): mma.sync warps
// (mainloop/mma_sync.cuh), wgmma warpgroups sharing one cp.async pipeline
// (mainloop/wgmma_multistage.cuh), or warp-specialised wgmma, one tile per block or persistent
// (mainloop/warp_specialized.cuh, walked by scheduler/tile_walk.cuh).
#pragma once
#include "moeblaze/gemm/mainloop/mma_sync.cuh"
#include "moeblaze/gemm/mainloop/wgmma_multistage.cuh"
#include "moeblaze/gemm/mainloop/warp_specialized.cuh"
#include "moeblaze/gemm/scheduler/tile_walk.cuh"

namespace moeblaze::gemm {

// The mainloop a tile config asks for: mma.sync, wgmma with a cp.async pipeline shared by
// all warps, or warp-specialised wgmma (the role's part of one tile of the block's pipeline).
// A step hook (NoStepHook) runs on the warp-specialised consumers only.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc, class Pipe, class Role,
          class Hook = NoStepHook>
MB_DEV void run_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a, const BSrc& b, int k_size,
                         bf16_t* smem, Pipe& pipe, Role role, const Hook& hook = {}) {
  if constexpr (Cfg::WARP_SPECIALIZED) {
    ws_mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem, pipe, role, hook);
  } else if constexpr (Cfg::WGMMA) {
    wgmma_mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem);
  } else {
    mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem);
  }
}

// One-tile kernels that do not split roles (the router GEMMs): a pipeline of their own.
template <class Cfg, bool A_KMAJOR, bool B_KMAJOR, class ASrc, class BSrc>
MB_DEV void run_mainloop(float (&acc)[Cfg::NB][Cfg::MT][Cfg::NT][4], const ASrc& a, const BSrc& b, int k_size,
                         bf16_t* smem) {
  static_assert(!Cfg::PERSISTENT, "persistent tiles walk their tiles with for_each_tile");
  PipeOf<Cfg> pipe = make_pipe<Cfg>();
  run_mainloop<Cfg, A_KMAJOR, B_KMAJOR>(acc, a, b, k_size, smem, pipe, AllThreads{});
}

}  // namespace moeblaze::gemm
