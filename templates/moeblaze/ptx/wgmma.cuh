// PTX wrappers of warpgroup MMA (sm_90a): shared-memory matrix descriptors, the fence /
// commit / wait of wgmma groups, the generic->async proxy fence, and the wgmma.mma_async
// instructions themselves (wgmma_ops.cuh, generated).
#pragma once
#include "moeblaze/ptx/cp_async.cuh"
#include "moeblaze/ptx/wgmma_ops.cuh"

namespace moeblaze::gemm {

// Shared-memory matrix descriptor, 128-byte swizzle (PTX ISA "matrix descriptor"): bits 0-13
// start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4 (1024: one
// 8-row atom), 62-63 swizzle mode (1 = 128 B).
// The descriptor in two halves: the lower (start address >> 4, leading byte offset) moves with
// the address; the upper (1024-byte stride, 128-byte swizzle) is the same for every tile. A
// start address inside shared memory (< 256 KiB) never carries out of its 14-bit field, so an
// offset of b bytes (a multiple of 16) is lo + b / 16.
MB_DEV unsigned sw128_desc_lo(unsigned smem, unsigned leading_bytes = 16) {
  return ((smem & 0x3FFFF) >> 4) | ((leading_bytes >> 4) << 16);
}
MB_DEV unsigned long long sw128_desc_from_lo(unsigned lo) {
  constexpr unsigned hi = (1024u >> 4) | (1u << 30);
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

MB_DEV void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
MB_DEV void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
MB_DEV void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy; wgmma reads it through the async
// proxy.
MB_DEV void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace moeblaze::gemm
