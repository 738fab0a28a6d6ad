// PTX wrappers of the special-function unit.
#pragma once
#include "moeblaze/common.cuh"

namespace moeblaze {

// 1/x by the SFU (rcp.approx: within 1 ulp), for x >= 1 here (no denormal inputs; inf -> 0).
MB_DEV float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

}  // namespace moeblaze
