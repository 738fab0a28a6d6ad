// The CUDA Driver API, loaded at run time with dlopen (never linked), so every binary
// starts on a machine without a GPU. RAII owners for every handle we create.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "moeblaze/common.cuh"

namespace moeblaze {

// Function table of the driver calls moeblaze uses, resolved with cuGetProcAddress so
// that versioned entry points (cuMemAlloc_v2, ...) are picked the way cuda.h means them.
struct CudaDriver {
#define MOEBLAZE_DRIVER_FUNCTIONS(X)                                                         \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)      \
  X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain)                   \
  X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxSynchronize)    \
  X(cuGetErrorName) X(cuGetErrorString) X(cuModuleLoadData) X(cuModuleUnload)               \
  X(cuModuleGetFunction) X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel)      \
  X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync)            \
  X(cuMemcpyDtoHAsync) X(cuMemsetD8Async) X(cuMemsetD32Async) X(cuMemGetInfo)               \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuEventCreate)              \
  X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime)         \
  X(cuCtxGetDevice) X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuTensorMapEncodeTiled)     \
  X(cuLaunchKernelEx) X(cuOccupancyMaxActiveClusters)
#define MOEBLAZE_DECLARE(name) decltype(&::name) name = nullptr;
  MOEBLAZE_DRIVER_FUNCTIONS(MOEBLAZE_DECLARE)
#undef MOEBLAZE_DECLARE
  void* library = nullptr;
};

// The process's driver table, loaded on first use. Throws NoGpu with the reason when
// libcuda cannot be opened or initialised, or no device is present.
const CudaDriver& cuda_driver();
// True when a GPU can be used; never throws. `why` receives the reason when not.
bool gpu_available(std::string* why = nullptr);

// Throws CudaError naming `call` when `result` is not CUDA_SUCCESS.
void check_cuda(CUresult result, const char* call);

// Whether a driver error leaves the context unusable: a kernel faulted (illegal address or
// instruction, misaligned address, hardware stack error, invalid PC, a launch failure or
// timeout). Every later call in the context returns the same error, whichever kernel it names.
bool is_context_fatal(int cuda_error_code);
#define MB_CU(expr) ::moeblaze::check_cuda((expr), #expr)

// Current device properties that kernels and the cache care about.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0, sm_count = 0;
  int max_smem_per_block_optin = 0;
  size_t total_memory = 0;
  int driver_version = 0;
  Arch arch() const;  // sm_90a on Hopper, else the SM number (cc X.Y: XY)
};

// The primary context of one device, made current on this thread. Shares the context
// with the CUDA runtime (and so with PyTorch).
class DeviceContext {
 public:
  explicit DeviceContext(int ordinal = 0);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  const DeviceInfo& info() const { return info_; }
  void make_current() const;

 private:
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  DeviceInfo info_;
};

// Owned device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr get() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <class T>
  T* as() const { return reinterpret_cast<T*>(ptr_); }
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return stream_; }
  void synchronize() const;

 private:
  CUstream stream_ = nullptr;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(CUstream s) const;
  void synchronize() const;
  CUevent get() const { return event_; }
  // Milliseconds between two recorded events.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  CUevent event_ = nullptr;
};

// A loaded cubin with one kernel in it.
class LoadedModule {
 public:
  // Also works out how many blocks of `threads` threads the device holds at once; `cluster`:
  // blocks per thread-block cluster the kernel is launched with (1: no clusters).
  LoadedModule(const std::vector<char>& cubin, const std::string& kernel_name, int dynamic_smem, int threads,
               int cluster = 1);
  ~LoadedModule();
  LoadedModule(const LoadedModule&) = delete;
  LoadedModule& operator=(const LoadedModule&) = delete;
  CUfunction function() const { return function_; }
  // Blocks resident on the whole device at once (occupancy x multiprocessors): the grid of a
  // persistent kernel.
  // With clusters: the blocks of the clusters the device holds at once.
  int resident_blocks() const { return resident_blocks_; }
  int cluster() const { return cluster_; }
  // Launches `grid` blocks (a multiple of cluster()) on `stream`; cuLaunchKernelEx with the
  // cluster dimension when cluster() > 1. A failure is a CudaError naming `kernel_name`.
  void launch(unsigned grid, unsigned threads, unsigned dynamic_smem, CUstream stream, void** params,
              const char* kernel_name) const;

 private:
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  int resident_blocks_ = 0;
  int cluster_ = 1;
};

}  // namespace moeblaze
