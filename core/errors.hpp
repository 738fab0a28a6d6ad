// Exceptions with context. Library code never prints or exits: it throws one of these.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

namespace moeblaze {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A bad argument: names the argument and says why. Thrown before any launch.
struct InvalidArgument : Error {
  std::string argument, reason;
  InvalidArgument(std::string arg, std::string why)
      : Error(arg + ": " + why), argument(std::move(arg)), reason(std::move(why)) {}
};

// No usable GPU (no libcuda, no device, or the driver refused to start).
struct NoGpu : Error {
  using Error::Error;
};

// A CUDA Driver API call failed.
struct CudaError : Error {
  std::string call;
  int code;
  CudaError(std::string call_, int code_, const std::string& what)
      : Error(call_ + " failed: " + what), call(std::move(call_)), code(code_) {}
};

// NVRTC could not compile a generated kernel. Keeps everything needed to reproduce it.
struct CompileError : Error {
  std::string kernel_name, log, source;
  std::vector<std::string> options;
  CompileError(std::string kernel, std::string log_, std::string source_, std::vector<std::string> opts,
               const std::string& what)
      : Error(what), kernel_name(std::move(kernel)), log(std::move(log_)), source(std::move(source_)),
        options(std::move(opts)) {}
};

}  // namespace moeblaze
