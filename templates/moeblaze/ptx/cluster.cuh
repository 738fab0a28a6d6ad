// PTX wrappers of thread-block clusters (sm_90): the block's rank in its cluster, the cluster-wide
// barrier, the fence that publishes mbarrier initialisation to the cluster, an arrive on the
// same mbarrier of another block of the cluster, and the TMA load that lands one box in the
// shared memory of several blocks of the cluster (multicast), completing its bytes on each
// destination's mbarrier at the same offset.
#pragma once
#include "moeblaze/device.cuh"
#include "moeblaze/kernel_args.cuh"
#include "moeblaze/ptx/mbarrier.cuh"

namespace moeblaze::gemm {

MB_DEV unsigned cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every block of the cluster (release / acquire: shared-memory writes before it,
// mbarrier initialisation included, are visible to the cluster after it).
MB_DEV void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

MB_DEV void fence_mbarrier_init_cluster() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// Arrives on the mbarrier at shared-window address `bar` as placed in cluster block `cta`, with the
// instruction's default semantics (release at CTA scope), as CUTLASS's ClusterBarrier::arrive.
// A consumer hands a stage back this way once the wgmma that read it has completed, so the
// partner's TMA writes into the buffer need no further ordering. `.release.cluster` compiled to
// MEMBAR.ALL.GPU + ERRBAR + CGAERRBAR before the arrive (ptxas, CUDA 13.0): a GPU-wide fence a
// warp a k-step in every cluster pair's consumer loop.
MB_DEV void mbar_arrive_cluster(unsigned bar, unsigned cta) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}

// Box at (k, row) of a 2-D tensor map into `smem` of every cluster block in `cta_mask` (bit i:
// block i), each completing the box's bytes on its own mbarrier at `bar`'s offset.
MB_DEV void tma_load_2d_multicast(bf16_t* smem, const TmaMap* map, int k, int row, mbar_t* bar, unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], "
      "[%4], %5;\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(k), "r"(row), "r"(smem_addr(bar)), "h"(cta_mask)
      : "memory");
}

}  // namespace moeblaze::gemm
