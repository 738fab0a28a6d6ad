// PTX wrappers of warpgroup register reallocation (setmaxnreg, sm_90a).
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

}  // namespace moeblaze::gemm
