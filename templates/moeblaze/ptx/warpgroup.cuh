// PTX wrappers of warpgroup register reallocation (setmaxnreg, sm_90a) and of the named
// barriers (bar.sync / bar.arrive) that order warpgroups without stopping the whole block.
#pragma once
#include "moeblaze/common.cuh"

namespace moeblaze::gemm {

template <int N>
MB_DEV void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
MB_DEV void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Named barrier `id` (1..15; 0 is __syncthreads) completes when `threads` threads (a multiple of
// 32) have reached it; bar_arrive counts this warp without waiting, bar_sync waits.
MB_DEV void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
MB_DEV void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace moeblaze::gemm
