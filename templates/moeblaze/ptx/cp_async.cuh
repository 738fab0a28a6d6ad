// PTX wrappers: shared-memory addresses and cp.async (16-byte global->shared copies that
// complete in commit groups). Compiled by NVRTC only.
#pragma once
#include "moeblaze/common.cuh"

namespace moeblaze {

MB_DEV unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16-byte global->shared copy to a shared-window address; when !valid it writes 16 zero bytes
// and reads nothing. Hot loops take their stage base through smem_addr once and add offsets:
// converting a generic pointer a copy at a time cost an S2R of the window base each time.
MB_DEV void cp_async16(unsigned smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0));
}
MB_DEV void cp_async16(void* smem, const void* gmem, bool valid) { cp_async16(smem_addr(smem), gmem, valid); }
// The same with the condition a sign: zero-fills (reads nothing) when `key` < 0, through
// cp.async's ignore-src predicate set by one compare (a bool condition makes the compiler build
// 16 or 0 in a register first: three more instructions a copy).
MB_DEV void cp_async16_unless_negative(unsigned smem, const void* gmem, int key) {
  asm volatile("{\n .reg .pred p;\n setp.lt.s32 p, %2, 0;\n cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(smem),
               "l"(gmem), "r"(key));
}
MB_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
MB_DEV void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace moeblaze
