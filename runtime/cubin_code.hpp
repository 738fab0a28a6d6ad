// The machine code size of a compiled kernel, read from its cubin (an ELF64 file): the size of
// the section `.text.<kernel name>`. A kernel engineer's measure of how far an epilogue's
// unrolling has gone (down_dgrad's was 110 KB of code with its IEEE divides, docs/performance.md
// "Decisions"); ncu's no-instruction stalls tell whether the instruction cache is the limit.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moeblaze {

// Bytes of the kernel's .text section (sm_90 instructions are 16 bytes each), or -1 when the
// buffer is not a little-endian ELF64 file or holds no such section.
int64_t kernel_code_bytes(const std::vector<char>& cubin, const std::string& kernel_name);

}  // namespace moeblaze
