// PTX wrapper: a global-memory line prefetched into L2. A hint: no register receives data and
// nothing waits on it. Callers pass addresses inside their operands.
#pragma once
#include "moeblaze/common.cuh"

namespace moeblaze {

MB_DEV void prefetch_l2(const void* gmem) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gmem));
}

}  // namespace moeblaze
