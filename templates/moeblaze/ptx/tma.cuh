// PTX wrappers of the Tensor Memory Accelerator (sm_90): bulk tensor loads into shared memory
// that complete on an mbarrier, tensor-map prefetch, and bulk tensor stores from shared memory
// with their commit / wait groups.
#pragma once
#include "moeblaze/device.cuh"
#include "moeblaze/ptx/mbarrier.cuh"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze::gemm {

// Box at (k, row) of a 2-D tensor map into shared memory (1024-byte aligned for the 128-byte
// swizzle); its bytes complete on `bar`. Out-of-range elements land as zeros and count too.
MB_DEV void tma_load_2d(bf16_t* smem, const TmaMap* map, int k, int row, mbar_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(smem)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(k), "r"(row), "r"(smem_addr(bar))
      : "memory");
}

MB_DEV void tma_prefetch_map(const TmaMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
template <int P>
MB_DEV void tma_prefetch_maps(const TmaMap* const (&maps)[P]) {
#pragma unroll
  for (int p = 0; p < P; ++p) tma_prefetch_map(maps[p]);
}

MB_DEV void tma_store_3d(const TmaMap* map, const bf16_t* smem, int col, int row, int expert) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(col), "r"(row), "r"(expert), "r"(smem_addr(smem))
               : "memory");
}
// The same box added into global memory instead of stored: the reduction runs in L2, in the
// map's element type (bf16: each element rounded once more after the add, as a separate add
// would; fp32 main gradients).
MB_DEV void tma_reduce_add_3d(const TmaMap* map, const void* smem, int col, int row, int expert) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(col), "r"(row), "r"(expert), "r"(smem_addr(smem))
               : "memory");
}
MB_DEV void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// The committed store groups have finished reading shared memory (the buffer may be rewritten).
MB_DEV void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Until at most the newest committed group may still be reading its shared memory.
MB_DEV void bulk_wait_read_all_but_newest() { asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory"); }
// The committed store groups have completed (their writes are done).
MB_DEV void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace moeblaze::gemm
