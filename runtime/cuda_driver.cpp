#include "cuda_driver.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>
#include <string_view>

namespace moeblaze {
namespace {

struct DriverLoad {
  CudaDriver table;
  std::string error;  // empty when usable
};

DriverLoad load_driver() {
  DriverLoad out;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    out.error = fmt::format("cannot open libcuda.so.1 ({}); no NVIDIA driver on this machine", dlerror());
    return out;
  }
  out.table.library = lib;
  using GetProc = decltype(&::cuGetProcAddress);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!get_proc) {
    out.error = "libcuda.so.1 has no cuGetProcAddress_v2: the driver is older than CUDA 12";
    return out;
  }
  // cuGetProcAddress hands out the newest ABI of a symbol up to the version asked for, which
  // need not be the signature cuda.h declares under the plain name: at 13000, cuCtxGetDevice
  // resolves to cuCtxGetDevice_v2(CUdevice*, CUcontext), and calling that through the
  // one-argument type crashed every process on the H200. Such symbols (CUDA 13.0 added
  // cuCtxGetDevice_v2 and cuCtxSynchronize_v2, both taking a context) are asked for at the
  // version whose ABI cuda.h's plain declaration is.
  auto abi_version = [](std::string_view name) {
    return name == "cuCtxGetDevice" || name == "cuCtxSynchronize" ? 12000 : CUDA_VERSION;
  };
#define MOEBLAZE_RESOLVE(name)                                                                  \
  {                                                                                             \
    void* fn = nullptr;                                                                         \
    CUdriverProcAddressQueryResult status{};                                                    \
    if (get_proc(#name, &fn, abi_version(#name), CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || \
        !fn) {                                                                                  \
      out.error = "the CUDA driver does not provide " #name;                                  \
      return out;                                                                               \
    }                                                                                           \
    out.table.name = reinterpret_cast<decltype(out.table.name)>(fn);                           \
  }
  MOEBLAZE_DRIVER_FUNCTIONS(MOEBLAZE_RESOLVE)
#undef MOEBLAZE_RESOLVE
  if (CUresult r = out.table.cuInit(0); r != CUDA_SUCCESS) {
    out.error = fmt::format("cuInit failed with error {}: no usable GPU", static_cast<int>(r));
    return out;
  }
  int count = 0;
  if (out.table.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    out.error = "the CUDA driver sees no GPU";
    return out;
  }
  return out;
}

const DriverLoad& driver_load() {
  static const DriverLoad load = load_driver();  // dlopen once per process
  return load;
}

}  // namespace

const CudaDriver& cuda_driver() {
  const DriverLoad& l = driver_load();
  if (!l.error.empty()) throw NoGpu(l.error);
  return l.table;
}

bool gpu_available(std::string* why) {
  const DriverLoad& l = driver_load();
  if (why) *why = l.error;
  return l.error.empty();
}

void check_cuda(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = "unknown";
  const char* text = "unknown error";
  const DriverLoad& l = driver_load();
  if (l.table.cuGetErrorName) l.table.cuGetErrorName(result, &name);
  if (l.table.cuGetErrorString) l.table.cuGetErrorString(result, &text);
  throw CudaError(call, static_cast<int>(result), fmt::format("{} ({})", name, text));
}

bool is_context_fatal(int code) {
  switch (static_cast<CUresult>(code)) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
      return true;
    default:
      return false;
  }
}

Arch DeviceInfo::arch() const {
  if (cc_major == 9 && cc_minor == 0) return Arch::sm_90a;
  return static_cast<Arch>(cc_major * 10 + cc_minor);
}

DeviceContext::DeviceContext(int ordinal) {
  const CudaDriver& d = cuda_driver();
  int count = 0;
  MB_CU(d.cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count)
    throw InvalidArgument("device", fmt::format("ordinal {} is outside [0, {})", ordinal, count));
  MB_CU(d.cuDeviceGet(&device_, ordinal));
  MB_CU(d.cuDevicePrimaryCtxRetain(&context_, device_));
  MB_CU(d.cuCtxSetCurrent(context_));
  info_.ordinal = ordinal;
  char name[256] = {};
  MB_CU(d.cuDeviceGetName(name, sizeof name, device_));
  info_.name = name;
  MB_CU(d.cuDeviceGetAttribute(&info_.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_));
  MB_CU(d.cuDeviceGetAttribute(&info_.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_));
  MB_CU(d.cuDeviceGetAttribute(&info_.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_));
  MB_CU(d.cuDeviceGetAttribute(&info_.max_smem_per_block_optin,
                               CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device_));
  MB_CU(d.cuDeviceTotalMem(&info_.total_memory, device_));
  MB_CU(d.cuDriverGetVersion(&info_.driver_version));
}

DeviceContext::~DeviceContext() {
  if (context_) cuda_driver().cuDevicePrimaryCtxRelease(device_);
}

void DeviceContext::make_current() const { MB_CU(cuda_driver().cuCtxSetCurrent(context_)); }

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) MB_CU(cuda_driver().cuMemAlloc(&ptr_, bytes));
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cuda_driver().cuMemFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = 0;
  o.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cuda_driver().cuMemFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = 0;
    o.bytes_ = 0;
  }
  return *this;
}
void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) throw InvalidArgument("upload", "copy past the end of the buffer");
  if (bytes) MB_CU(cuda_driver().cuMemcpyHtoD(ptr_ + offset, host, bytes));
}
void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) throw InvalidArgument("download", "copy past the end of the buffer");
  if (bytes) MB_CU(cuda_driver().cuMemcpyDtoH(host, ptr_ + offset, bytes));
}

Stream::Stream() { MB_CU(cuda_driver().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING)); }
Stream::~Stream() {
  if (stream_) cuda_driver().cuStreamDestroy(stream_);
}
void Stream::synchronize() const { MB_CU(cuda_driver().cuStreamSynchronize(stream_)); }

Event::Event() { MB_CU(cuda_driver().cuEventCreate(&event_, CU_EVENT_DEFAULT)); }
Event::~Event() {
  if (event_) cuda_driver().cuEventDestroy(event_);
}
void Event::record(CUstream s) const { MB_CU(cuda_driver().cuEventRecord(event_, s)); }
void Event::synchronize() const { MB_CU(cuda_driver().cuEventSynchronize(event_)); }
float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.f;
  MB_CU(cuda_driver().cuEventElapsedTime(&ms, start.event_, end.event_));
  return ms;
}

namespace {

CUlaunchConfig launch_config(unsigned grid, unsigned threads, unsigned dynamic_smem, CUstream stream,
                             CUlaunchAttribute* cluster_dim, int cluster) {
  CUlaunchConfig c{};
  c.gridDimX = grid;
  c.gridDimY = c.gridDimZ = 1;
  c.blockDimX = threads;
  c.blockDimY = c.blockDimZ = 1;
  c.sharedMemBytes = dynamic_smem;
  c.hStream = stream;
  cluster_dim->id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster_dim->value.clusterDim.x = static_cast<unsigned>(cluster);
  cluster_dim->value.clusterDim.y = cluster_dim->value.clusterDim.z = 1;
  c.attrs = cluster_dim;
  c.numAttrs = 1;
  return c;
}

}  // namespace

LoadedModule::LoadedModule(const std::vector<char>& cubin, const std::string& kernel_name, int dynamic_smem,
                           int threads, int cluster)
    : cluster_(cluster) {
  const CudaDriver& d = cuda_driver();
  MB_CU(d.cuModuleLoadData(&module_, cubin.data()));
  try {
    MB_CU(d.cuModuleGetFunction(&function_, module_, kernel_name.c_str()));
    if (dynamic_smem > 48 * 1024)
      MB_CU(d.cuFuncSetAttribute(function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem));
    int per_sm = 0, sms = 0;
    CUdevice dev;
    MB_CU(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, function_, threads, dynamic_smem));
    MB_CU(d.cuCtxGetDevice(&dev));
    MB_CU(d.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    if (per_sm < 1)
      throw Error(fmt::format("kernel {}: no block of {} threads and {} bytes of shared memory fits a multiprocessor",
                              kernel_name, threads, dynamic_smem));
    resident_blocks_ = per_sm * sms;
    if (cluster_ > 1) {  // pairs sit in one GPC each: fewer than (blocks per SM x SMs) / 2 of them fit
      CUlaunchAttribute dim;
      const CUlaunchConfig c = launch_config(static_cast<unsigned>(resident_blocks_), static_cast<unsigned>(threads),
                                             static_cast<unsigned>(dynamic_smem), nullptr, &dim, cluster_);
      int clusters = 0;
      MB_CU(d.cuOccupancyMaxActiveClusters(&clusters, function_, &c));
      if (clusters < 1)
        throw Error(fmt::format("kernel {}: no cluster of {} blocks of {} threads and {} bytes of shared memory fits",
                                kernel_name, cluster_, threads, dynamic_smem));
      resident_blocks_ = clusters * cluster_;
    }
  } catch (...) {
    d.cuModuleUnload(module_);
    throw;
  }
}
void LoadedModule::launch(unsigned grid, unsigned threads, unsigned dynamic_smem, CUstream stream, void** params,
                          const char* kernel_name) const {
  const CudaDriver& d = cuda_driver();
  if (cluster_ == 1) {
    check_cuda(d.cuLaunchKernel(function_, grid, 1, 1, threads, 1, 1, dynamic_smem, stream, params, nullptr), kernel_name);
    return;
  }
  CUlaunchAttribute dim;
  const CUlaunchConfig c = launch_config(grid, threads, dynamic_smem, stream, &dim, cluster_);
  check_cuda(d.cuLaunchKernelEx(&c, function_, params, nullptr), kernel_name);
}

LoadedModule::~LoadedModule() {
  if (module_) cuda_driver().cuModuleUnload(module_);
}

}  // namespace moeblaze
