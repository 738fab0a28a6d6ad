// Where the kernels' run-time compiler comes from: NVRTC (libnvrtc.so.13, opened with dlopen and
// never linked, as libcuda is) and the headers the kernels compile against: CUDA's (cuda_bf16.h,
// CCCL, crt/) and, for the kernel layer's kernels, CUTLASS's. A CUDA toolkit holds NVRTC and
// CUDA's headers; so do NVIDIA's PyPI packages (nvidia-cuda-nvrtc, -runtime, -cccl, -crt, which
// install into site-packages/nvidia/cu13 with the toolkit's include/ and lib/ layout), which is
// how the Python wheel runs on a machine without a toolkit.
//
// Each part comes from the first place in this order that holds it (docs/design.md, "Where NVRTC
// and the headers come from", says why; README lists the variables):
//   1. $CUDA_HOME, then $CUDA_PATH: a CUDA root (a toolkit, or a site-packages' nvidia/cu13),
//      taken when set and holding the part;
//   2. NVIDIA's PyPI packages: the folders a host program registered (the Python package,
//      from importlib), those in the site-packages holding this library (a wheel's install),
//      and those of the active Python environment ($VIRTUAL_ENV, then $CONDA_PREFIX);
//   3. the CUDA toolkit the library was built against (not in a wheel);
//   4. /usr/local/cuda, /usr/local/cuda-13.0;
//   5. NVRTC only: the dynamic loader's own search (LD_LIBRARY_PATH, the ld.so cache).
// The places in 2 to 4 give CUDA's headers only when they hold all three sets (cuda_bf16.h,
// CCCL's cuda/std, crt/): a partial set, such as the NVRTC and runtime packages PyTorch
// installs, must not shadow a complete toolkit. CUTLASS's headers: $MOEBLAZE_CUTLASS_INCLUDE,
// the nvidia-cutlass package in the places of 2, then the package found when the library was
// built (not in a wheel); only the pinned release (kCutlassVersion) is taken.
#pragma once
#include <string>
#include <vector>

namespace moeblaze {

// NVIDIA's PyPI packages as a host program found them (the Python package asks importlib).
struct PackageDirs {
  // Folders holding include/ and lib/ of nvidia-cuda-nvrtc, -runtime, -cccl and -crt
  // (site-packages/nvidia/cu13; one folder for all four unless they sit in different
  // site-packages).
  std::vector<std::string> cuda_roots;
  // nvidia-cutlass's header folder (site-packages/cutlass_library/source/include); may be empty.
  std::string cutlass_include;
};

// Makes `dirs` the first of the package places (2 above) for every search that starts after
// it, for the whole process. NVRTC is opened once per process, at its first use: registering
// after that changes where the headers come from, not which NVRTC compiles.
void register_package_dirs(const PackageDirs& dirs);

// One part of the toolchain: where it was found, or why not.
struct ToolchainPart {
  std::vector<std::string> paths;  // NVRTC: the library file; headers: the include folders, in -I order
  std::string place;               // the place that gave it, e.g. "CUDA_HOME=/opt/cuda"
  std::string error;               // empty when found; else every place looked and why each was passed over
};

struct ToolchainReport {
  ToolchainPart nvrtc, cuda_headers, cutlass_headers;
  std::string nvrtc_version;  // "13.0"; empty when NVRTC could not be opened
};

// Every part as a compile would find it now. Never throws: a part not found carries its error.
ToolchainReport toolchain_report();

// The include folders of CUDA's headers, in -I order. Throws Error naming every place looked.
std::vector<std::string> find_cuda_include_dirs();

// The CUTLASS release whose headers (CuTe) the kernel layer (templates/moeblaze/sm90/) is
// written and cached against: the nvidia-cutlass package's version, pinned in scripts/setup.sh
// and pyproject.toml. Part of the binary cache key of every kernel that includes them.
constexpr const char* kCutlassVersion = "4.2.0";
// The folder holding CUTLASS's cute/ and cutlass/ headers of release kCutlassVersion. Throws
// Error naming every place looked, and the release found where it was another.
std::string find_cutlass_include_dir();

}  // namespace moeblaze
