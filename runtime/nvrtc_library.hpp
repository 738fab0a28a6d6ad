// NVRTC's C interface as a table of functions looked up in the library opened at run time
// (toolchain.hpp says where it comes from). The two types it needs are declared here the way
// nvrtc.h (CUDA 13) declares them, so that nothing needs nvrtc.h to build: the wheel builds
// without a CUDA toolkit. Where nvrtc.h is at hand, nvrtc_library.cpp checks every signature
// against it (toolchain.cpp, which also opens the library).
#pragma once
#include <cstddef>
#include <string>

namespace moeblaze::nvrtc {

using Result = int;  // nvrtcResult: a C enum; 0 is NVRTC_SUCCESS
constexpr Result kSuccess = 0;
struct ProgramImpl;
using Program = ProgramImpl*;  // nvrtcProgram: an opaque handle

// X(name, result type, parameter list), with R and P the result and program types.
#define MOEBLAZE_NVRTC_FUNCTIONS(X, R, P)                                                           \
  X(nvrtcVersion, R, (int*, int*))                                                                 \
  X(nvrtcGetErrorString, const char*, (R))                                                         \
  X(nvrtcCreateProgram, R, (P*, const char*, const char*, int, const char* const*, const char* const*)) \
  X(nvrtcDestroyProgram, R, (P*))                                                                  \
  X(nvrtcCompileProgram, R, (P, int, const char* const*))                                          \
  X(nvrtcGetProgramLogSize, R, (P, size_t*))                                                       \
  X(nvrtcGetProgramLog, R, (P, char*))                                                             \
  X(nvrtcGetCUBINSize, R, (P, size_t*))                                                            \
  X(nvrtcGetCUBIN, R, (P, char*))                                                                  \
  X(nvrtcGetPTXSize, R, (P, size_t*))                                                              \
  X(nvrtcGetPTX, R, (P, char*))

struct Library {
#define MOEBLAZE_NVRTC_DECLARE(name, result, params) result(*name) params = nullptr;
  MOEBLAZE_NVRTC_FUNCTIONS(MOEBLAZE_NVRTC_DECLARE, Result, Program)
#undef MOEBLAZE_NVRTC_DECLARE
  std::string path;   // the file opened
  std::string place;  // the place of the search order it came from
  std::string version() const;  // "major.minor"
};

// The process's NVRTC, opened at the first call. Throws Error naming every place looked when
// none gives a usable libnvrtc.so.13 (a failed search is tried again at the next call).
const Library& library();

}  // namespace moeblaze::nvrtc
