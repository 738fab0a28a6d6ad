// What the generator hands the compiler: one translation unit holding one extern "C" kernel.
// The headers it includes are the embedded templates (embedded_templates.hpp).
#pragma once
#include <string>

namespace moeblaze {

struct KernelSource {
  std::string kernel_name;  // the extern "C" symbol
  std::string file_name;    // name NVRTC reports in diagnostics
  std::string text;
  // The source includes CUTLASS's headers (CuTe: the kernel layer, templates/moeblaze/sm90/),
  // which NVRTC finds on disk (runtime/nvrtc_compiler.hpp find_cutlass_include_dir).
  bool needs_cutlass = false;
};

}  // namespace moeblaze
