// PTX wrappers of the shared-memory transaction barriers (PTX ISA "mbarrier"): init, arrive,
// non-blocking test and blocking wait on a phase parity, expected transaction bytes (TMA), and
// the arrive that fires when a thread's cp.async copies have landed.
#pragma once
#include "moeblaze/ptx/cp_async.cuh"

namespace moeblaze::gemm {

typedef unsigned long long mbar_t;

// The barrier's current phase completes only when `bytes` more have landed through
// complete_tx (on top of its pending arrivals). Issue before the copies it covers.
MB_DEV void mbar_expect_tx(mbar_t* bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

MB_DEV void mbar_init(mbar_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// The pipeline's operations below take the barrier as a shared-window address (smem_addr),
// which a pipeline computes once for all its barriers instead of converting a pointer at every use.

// Whether the phase of the given parity has completed (non-blocking).
MB_DEV bool mbar_test(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
MB_DEV void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nMB_WAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra MB_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
MB_DEV void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives on `bar` when every cp.async this thread issued so far has completed; counts as one
// of the arrivals the barrier was initialised with.
MB_DEV void cp_async_arrive_noinc(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

}  // namespace moeblaze::gemm
