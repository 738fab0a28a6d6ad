// NVRTC: generated instantiation source -> cubin with its ptxas resource report.
// Needs no GPU. The kernel templates come from the embedded copies of templates/; NVRTC itself,
// CUDA's headers and CUTLASS's (for the kernels that include them) are found at run time
// (toolchain.hpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "generator/kernel_source.hpp"
#include "moeblaze/common.cuh"
#include "toolchain.hpp"

namespace moeblaze {

struct ResourceReport {
  int registers = -1;
  int stack_bytes = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  int static_smem_bytes = 0;
  int64_t code_bytes = -1;  // the kernel's machine code (cubin_code.hpp), -1 when unknown
  bool has_spills() const { return spill_store_bytes > 0 || spill_load_bytes > 0 || stack_bytes > 0; }
};

struct CompileOptions {
  Arch arch = Arch::sm_90a;
  std::vector<std::string> extra;  // appended as they are
  bool keep_ptx = false;           // also return the PTX (to check which instructions a kernel uses)
};

struct CompiledKernel {
  std::string kernel_name;
  std::string arch;  // the target's name (to_string(Arch)), as the binary cache stores it
  std::vector<char> cubin;
  std::string ptx;  // only with CompileOptions::keep_ptx
  ResourceReport resources;
  std::string log;  // full NVRTC log (ptxas -v report included)
  std::vector<std::string> options;
  double compile_ms = 0;
};

// Compiles `source` for options.arch. Throws CompileError (log, options, source) on failure.
CompiledKernel compile_kernel(const KernelSource& source, const CompileOptions& options);

// "major.minor" of the NVRTC library in use (opening it first: throws Error when none is found).
std::string nvrtc_version();

// Parses the ptxas -v lines of an NVRTC log for `kernel_name`.
ResourceReport parse_resource_report(const std::string& log, const std::string& kernel_name);
// A compiled kernel's whole report: the log's lines plus the code size read from its cubin
// (freshly compiled and cached kernels alike).
ResourceReport kernel_resources(const std::string& log, const std::vector<char>& cubin, const std::string& kernel_name);

}  // namespace moeblaze
