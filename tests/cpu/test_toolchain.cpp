// Where NVRTC and the headers come from (runtime/toolchain.hpp): the order of the places, the
// override, a partial package set passed over, the packages before a toolkit, and CUTLASS's
// release check. Fake CUDA roots in a temporary folder stand in for packages and toolkits.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "cpu/temp_dir.hpp"
#include "core/errors.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/toolchain.hpp"

using namespace moeblaze;
namespace fs = std::filesystem;

namespace {

using testing::TempDir;

// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (saved_) ::setenv(name_, saved_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

// Package folders registered for one scope (the process's registration is empty in this program).
struct ScopedPackages {
  explicit ScopedPackages(const PackageDirs& d) { register_package_dirs(d); }
  ~ScopedPackages() { register_package_dirs({}); }
};

void touch(const fs::path& f, const std::string& text = "") {
  fs::create_directories(f.parent_path());
  std::ofstream(f) << text;
}

// A CUDA root as NVIDIA's packages lay it out (site-packages/nvidia/cu13), headers only: the
// runtime's cuda_bf16.h, CCCL's cuda/std and crt/, each present when asked for.
fs::path fake_root(const fs::path& at, bool runtime, bool cccl, bool crt) {
  if (runtime) touch(at / "include" / "cuda_bf16.h");
  if (cccl) touch(at / "include" / "cccl" / "cuda" / "std" / "cstdint");
  if (crt) touch(at / "include" / "crt" / "host_defines.h");
  fs::create_directories(at / "include");
  return at;
}

std::string cutlass_version_h(int major, int minor, int patch) {
  return "#define CUTLASS_MAJOR " + std::to_string(major) + "\n#define CUTLASS_MINOR " + std::to_string(minor) +
         "\n#define CUTLASS_PATCH " + std::to_string(patch) + "\n";
}

}  // namespace

TEST_CASE("toolchain: CUDA_HOME is taken as it is when it holds cuda_bf16.h, before the packages") {
  TempDir dir;
  const fs::path home = fake_root(dir.path / "home", true, false, false);
  const fs::path pkgs = fake_root(dir.path / "site" / "nvidia" / "cu13", true, true, true);
  ScopedPackages packages({{pkgs.string()}, ""});
  ScopedEnv cuda_home("CUDA_HOME", home.string());
  ScopedEnv cuda_path("CUDA_PATH", std::nullopt);
  const std::vector<std::string> dirs = find_cuda_include_dirs();
  REQUIRE(dirs.size() == 1);  // no include/cccl there: only the folders that exist
  CHECK(dirs[0] == (home / "include").string());
  CHECK(toolchain_report().cuda_headers.place == "CUDA_HOME=" + home.string());
}

TEST_CASE("toolchain: the packages give the headers before a toolkit, and only when complete") {
  TempDir dir;
  ScopedEnv cuda_home("CUDA_HOME", std::nullopt);
  ScopedEnv cuda_path("CUDA_PATH", std::nullopt);
  ScopedEnv venv("VIRTUAL_ENV", std::nullopt);
  ScopedEnv conda("CONDA_PREFIX", std::nullopt);
  SUBCASE("complete: runtime, cccl and crt in one root") {
    const fs::path pkgs = fake_root(dir.path / "site" / "nvidia" / "cu13", true, true, true);
    ScopedPackages packages({{pkgs.string()}, ""});
    const ToolchainPart p = toolchain_report().cuda_headers;
    CHECK(p.error.empty());
    CHECK(p.place == "NVIDIA's PyPI packages registered by the host program");
    CHECK(p.paths == std::vector<std::string>{(pkgs / "include").string(), (pkgs / "include" / "cccl").string()});
  }
  SUBCASE("complete across two site-packages") {
    const fs::path a = fake_root(dir.path / "a" / "nvidia" / "cu13", true, false, true);
    const fs::path b = fake_root(dir.path / "b" / "nvidia" / "cu13", false, true, false);
    ScopedPackages packages({{a.string(), b.string()}, ""});
    const ToolchainPart p = toolchain_report().cuda_headers;
    CHECK(p.place == "NVIDIA's PyPI packages registered by the host program");
    CHECK(p.paths.size() == 3);  // a/include, b/include, b/include/cccl
  }
  SUBCASE("partial (PyTorch's nvrtc and runtime, no cccl, no crt): passed over") {
    const fs::path pkgs = fake_root(dir.path / "site" / "nvidia" / "cu13", true, false, false);
    ScopedPackages packages({{pkgs.string()}, ""});
    const ToolchainPart p = toolchain_report().cuda_headers;
    CHECK(p.place != "NVIDIA's PyPI packages registered by the host program");
    // Without a toolkit on this machine the error names the partial set and what it lacks.
    if (!p.error.empty()) {
      CHECK(p.error.find("registered by the host program") != std::string::npos);
      CHECK(p.error.find("no CCCL's cuda/std (nvidia-cuda-cccl), crt/host_defines.h (nvidia-cuda-crt)") !=
            std::string::npos);
      CHECK(p.error.find("CUDA_HOME, CUDA_PATH: not set") != std::string::npos);
    }
  }
}

TEST_CASE("toolchain: a virtual environment's packages are found without registering them") {
  TempDir dir;
  const fs::path site = dir.path / "venv" / "lib" / "python3.11" / "site-packages";
  const fs::path pkgs = fake_root(site / "nvidia" / "cu13", true, true, true);
  touch(site / "cutlass_library" / "source" / "include" / "cutlass" / "version.h",
        cutlass_version_h(4, 2, 0));
  ScopedEnv cuda_home("CUDA_HOME", std::nullopt);
  ScopedEnv cuda_path("CUDA_PATH", std::nullopt);
  ScopedEnv cutlass("MOEBLAZE_CUTLASS_INCLUDE", std::nullopt);
  ScopedEnv venv("VIRTUAL_ENV", (dir.path / "venv").string());
  const ToolchainReport r = toolchain_report();
  CHECK(r.cuda_headers.place == "NVIDIA's PyPI packages of $VIRTUAL_ENV (" + site.string() + ")");
  CHECK(r.cuda_headers.paths.front() == (pkgs / "include").string());
  CHECK(r.cutlass_headers.paths == std::vector<std::string>{(site / "cutlass_library" / "source" / "include").string()});
}

TEST_CASE("toolchain: CUTLASS from the registered package, only the pinned release") {
  TempDir dir;
  const fs::path inc = dir.path / "cutlass_library" / "source" / "include";
  ScopedEnv cutlass("MOEBLAZE_CUTLASS_INCLUDE", std::nullopt);
  touch(inc / "cutlass" / "version.h", cutlass_version_h(4, 2, 0));
  {
    ScopedPackages packages({{}, inc.string()});
    CHECK(find_cutlass_include_dir() == inc.string());
    CHECK(toolchain_report().cutlass_headers.place == "NVIDIA's PyPI packages registered by the host program");
  }
  touch(inc / "cutlass" / "version.h", cutlass_version_h(4, 1, 0));
  ScopedPackages packages({{}, inc.string()});
  // Another release: passed over with the reason (the build-time package may still be found).
  try {
    CHECK(find_cutlass_include_dir() != inc.string());
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("CUTLASS 4.1.0, not 4.2.0") != std::string::npos);
  }
}

TEST_CASE("toolchain: NVRTC is opened at run time and names where it came from") {
  const ToolchainReport r = toolchain_report();
  if (!r.nvrtc.error.empty()) {
    // No NVRTC on this machine: the error names every place looked.
    CHECK(r.nvrtc.error.find("libnvrtc.so.13") != std::string::npos);
    CHECK(r.nvrtc.error.find("/usr/local/cuda") != std::string::npos);
    return;
  }
  REQUIRE(r.nvrtc.paths.size() == 1);
  CHECK(r.nvrtc.paths[0].find("libnvrtc.so.13") != std::string::npos);
  CHECK(!r.nvrtc.place.empty());
  CHECK(r.nvrtc_version.rfind("13.", 0) == 0);
  CHECK(nvrtc_version() == r.nvrtc_version);
}
