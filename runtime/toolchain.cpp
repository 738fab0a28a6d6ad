// The search of toolchain.hpp, and NVRTC opened with dlopen (nvrtc_library.hpp).
#include "toolchain.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <type_traits>

#include "core/errors.hpp"
#include "nvrtc_library.hpp"

// Where nvrtc.h is at hand (a toolkit build), the table's signatures must be nvrtc.h's.
#if __has_include(<nvrtc.h>)
#include <nvrtc.h>
static_assert(sizeof(nvrtcResult) == sizeof(moeblaze::nvrtc::Result) && NVRTC_SUCCESS == moeblaze::nvrtc::kSuccess);
#define MOEBLAZE_NVRTC_CHECK(name, result, params) \
  static_assert(std::is_same_v<decltype(&::name), result(*) params>, #name " differs from nvrtc.h");
MOEBLAZE_NVRTC_FUNCTIONS(MOEBLAZE_NVRTC_CHECK, nvrtcResult, nvrtcProgram)
#undef MOEBLAZE_NVRTC_CHECK
#endif

namespace moeblaze {
namespace fs = std::filesystem;
namespace {

constexpr const char* kNvrtcSoname = "libnvrtc.so.13";

std::mutex g_registered_mutex;
PackageDirs g_registered;  // register_package_dirs; read under the mutex

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : "";
}

bool present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

bool is_folder(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// A path as places are told apart: resolved links, so /usr/local/cuda and its target are one.
std::string identity(const fs::path& p) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(p, ec);
  return (ec ? p : c).string();
}

// One place of the search order: the CUDA roots it names and the CUTLASS header folder it may hold.
struct Place {
  std::string name;
  std::vector<fs::path> cuda_roots;
  fs::path cutlass_include;
  bool user_given = false;  // CUDA_HOME or CUDA_PATH: its headers are taken as they are
};

// The folder of the file holding this code: libmoeblaze_c.so's in a wheel (site-packages/moeblaze),
// a program's own folder where the library is linked in statically.
fs::path this_library_folder() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&this_library_folder), &info) || !info.dli_fname) return {};
  std::error_code ec;
  const fs::path p = fs::absolute(info.dli_fname, ec);
  return ec ? fs::path{} : p.parent_path();
}

// prefix/lib/python3.*/site-packages, as a virtual environment or a conda environment lays them out.
std::vector<fs::path> site_packages_of(const fs::path& prefix) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(prefix / "lib", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("python3", 0) == 0 && is_folder(e.path() / "site-packages")) out.push_back(e.path() / "site-packages");
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A site-packages folder as a package place, when it holds any of the packages.
void add_site(std::vector<Place>& places, const std::string& name, const fs::path& site) {
  Place p{name + " (" + site.string() + ")", {}, {}, false};
  if (is_folder(site / "nvidia" / "cu13")) p.cuda_roots.push_back(site / "nvidia" / "cu13");
  if (is_folder(site / "cutlass_library" / "source" / "include"))
    p.cutlass_include = site / "cutlass_library" / "source" / "include";
  if (!p.cuda_roots.empty() || !p.cutlass_include.empty()) places.push_back(std::move(p));
}

// NVIDIA's PyPI packages (place 2 of toolchain.hpp), in order.
std::vector<Place> package_places() {
  std::vector<Place> places;
  {
    std::lock_guard<std::mutex> lock(g_registered_mutex);
    if (!g_registered.cuda_roots.empty() || !g_registered.cutlass_include.empty()) {
      Place p{"NVIDIA's PyPI packages registered by the host program", {}, g_registered.cutlass_include, false};
      for (const auto& r : g_registered.cuda_roots) p.cuda_roots.emplace_back(r);
      places.push_back(std::move(p));
    }
  }
  if (const fs::path here = this_library_folder(); !here.empty())
    add_site(places, "NVIDIA's PyPI packages beside this library", here.parent_path());
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const std::string v = env(var); !v.empty())
      for (const auto& site : site_packages_of(v))
        add_site(places, fmt::format("NVIDIA's PyPI packages of ${}", var), site);
  return places;
}

// Every place of the search order for NVRTC and CUDA's headers (1 to 4 of toolchain.hpp), each
// once; `unset` gets the override variables that are not set.
std::vector<Place> cuda_places(std::vector<std::string>& unset) {
  std::vector<Place> all;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const std::string v = env(var); !v.empty()) all.push_back(Place{fmt::format("{}={}", var, v), {v}, {}, true});
    else unset.push_back(var);
  }
  for (auto& p : package_places())
    if (!p.cuda_roots.empty()) all.push_back(std::move(p));
#ifdef MOEBLAZE_CUDA_TOOLKIT_DEFAULT
  all.push_back(Place{fmt::format("the CUDA toolkit found at build time ({})", MOEBLAZE_CUDA_TOOLKIT_DEFAULT),
                      {MOEBLAZE_CUDA_TOOLKIT_DEFAULT}, {}, false});
#endif
  for (const char* prefix : {"/usr/local/cuda", "/usr/local/cuda-13.0"}) all.push_back(Place{prefix, {prefix}, {}, false});
  // A place whose roots an earlier place already named says nothing new.
  std::vector<Place> out;
  std::set<std::string> seen;
  for (auto& p : all) {
    std::string key;
    for (const auto& r : p.cuda_roots) key += identity(r) + "\n";
    if (seen.insert(key).second) out.push_back(std::move(p));
  }
  return out;
}

std::string list(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += "\n  " + l;
  return s;
}

std::string unset_line(const std::vector<std::string>& unset) {
  std::string s;
  for (const auto& v : unset) s += (s.empty() ? "" : ", ") + v;
  return s.empty() ? "" : s + ": not set";
}

// ---- NVRTC ----------------------------------------------------------------------------

// Resolves every function of the table from `handle`; the empty string when all are there.
std::string resolve(void* handle, nvrtc::Library& lib) {
#define MOEBLAZE_NVRTC_RESOLVE(name, result, params)                        \
  lib.name = reinterpret_cast<decltype(lib.name)>(dlsym(handle, #name)); \
  if (!lib.name) return "it has no " #name;
  MOEBLAZE_NVRTC_FUNCTIONS(MOEBLAZE_NVRTC_RESOLVE, nvrtc::Result, nvrtc::Program)
#undef MOEBLAZE_NVRTC_RESOLVE
  return "";
}

// Opens `file` (a path, or the bare soname for the loader's own search) as NVRTC 13. The library
// stays open for the life of the process.
bool try_open(const std::string& file, const std::string& place, nvrtc::Library& out, std::string& why) {
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    why = e ? e : "dlopen failed";
    return false;
  }
  nvrtc::Library lib;
  if (std::string missing = resolve(h, lib); !missing.empty()) {
    why = missing;
    dlclose(h);
    return false;
  }
  int major = 0, minor = 0;
  if (lib.nvrtcVersion(&major, &minor) != nvrtc::kSuccess || major != 13) {
    why = fmt::format("it is NVRTC {}.{}, not 13", major, minor);
    dlclose(h);
    return false;
  }
  lib.path = file;
  if (Dl_info info{}; file.find('/') == std::string::npos && dladdr(reinterpret_cast<void*>(lib.nvrtcVersion), &info) &&
                      info.dli_fname)
    lib.path = info.dli_fname;  // the file the loader picked
  lib.place = place;
  out = std::move(lib);
  return true;
}

// Searches NVRTC; `looked` gets a line per place passed over.
bool find_nvrtc(nvrtc::Library& out, std::vector<std::string>& looked) {
  std::vector<std::string> unset;
  const std::vector<Place> places = cuda_places(unset);
  if (!unset.empty()) looked.push_back(unset_line(unset));
  for (const auto& p : places) {
    bool any = false;
    for (const auto& root : p.cuda_roots)
      for (const char* sub : {"lib64", "lib"}) {
        const fs::path f = root / sub / kNvrtcSoname;
        if (!present(f)) continue;
        any = true;
        std::string why;
        if (try_open(f.string(), p.name, out, why)) return true;
        looked.push_back(fmt::format("{}: {}: {}", p.name, f.string(), why));
        break;  // lib64 and lib are often one folder
      }
    if (!any) looked.push_back(fmt::format("{}: no lib64/{} or lib/{}", p.name, kNvrtcSoname, kNvrtcSoname));
  }
  const std::string loader = "the dynamic loader's search path (LD_LIBRARY_PATH, the ld.so cache)";
  std::string why;
  if (try_open(kNvrtcSoname, loader, out, why)) return true;
  looked.push_back(fmt::format("{}: {}", loader, why));
  return false;
}

std::string nvrtc_not_found(const std::vector<std::string>& looked) {
  return fmt::format("NVRTC ({}) not found. Looked in:{}\nInstall NVIDIA's nvidia-cuda-nvrtc package (`pip install "
                     "\"nvidia-cuda-nvrtc==13.0.*\"`) or a CUDA 13 toolkit, or set CUDA_HOME to a CUDA 13 root.",
                     kNvrtcSoname, list(looked));
}

std::mutex g_nvrtc_mutex;
std::unique_ptr<nvrtc::Library> g_nvrtc;  // set once found; never replaced

// ---- CUDA's headers -------------------------------------------------------------------

struct HeaderSearch {
  std::vector<std::string> dirs;
  std::string place, error;
};

HeaderSearch search_cuda_headers() {
  std::vector<std::string> unset, looked;
  const std::vector<Place> places = cuda_places(unset);
  if (!unset.empty()) looked.push_back(unset_line(unset));
  for (const auto& p : places) {
    std::vector<fs::path> dirs;
    for (const auto& root : p.cuda_roots)
      for (const fs::path& d : {root / "include", root / "include" / "cccl"})
        if (is_folder(d) && std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
    auto holds = [&](const fs::path& rel) {
      return std::any_of(dirs.begin(), dirs.end(), [&](const fs::path& d) { return present(d / rel); });
    };
    std::vector<std::string> missing;
    if (!holds("cuda_bf16.h")) missing.push_back("cuda_bf16.h (nvidia-cuda-runtime)");
    if (!p.user_given) {
      if (!holds(fs::path("cuda") / "std" / "cstdint")) missing.push_back("CCCL's cuda/std (nvidia-cuda-cccl)");
      if (!holds(fs::path("crt") / "host_defines.h")) missing.push_back("crt/host_defines.h (nvidia-cuda-crt)");
    }
    if (missing.empty()) {
      HeaderSearch found;
      for (const auto& d : dirs) found.dirs.push_back(d.string());
      found.place = p.name;
      return found;
    }
    std::string m;
    for (const auto& s : missing) m += (m.empty() ? "" : ", ") + s;
    looked.push_back(fmt::format("{}: no {}", p.name, m));
  }
  HeaderSearch none;
  none.error = fmt::format("CUDA headers not found (the kernels include cuda_bf16.h, CCCL and crt/). Looked in:{}\n"
                           "Install NVIDIA's packages (`pip install \"nvidia-cuda-runtime==13.0.*\" \"nvidia-cuda-cccl=="
                           "13.0.*\" \"nvidia-cuda-crt==13.0.*\"`) or a CUDA 13 toolkit, or set CUDA_HOME to a CUDA 13 root.",
                           list(looked));
  return none;
}

// ---- CUTLASS's headers ----------------------------------------------------------------

// "4.2.0" from cutlass/version.h's CUTLASS_MAJOR / _MINOR / _PATCH; empty when unreadable.
std::string cutlass_header_version(const fs::path& include_dir) {
  std::ifstream in(include_dir / "cutlass" / "version.h");
  if (!in) return {};
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string parts[3];
  const char* names[3] = {"CUTLASS_MAJOR", "CUTLASS_MINOR", "CUTLASS_PATCH"};
  for (int i = 0; i < 3; ++i) {
    std::smatch m;
    if (!std::regex_search(text, m, std::regex(std::string("#define ") + names[i] + R"(\s+(\d+))"))) return {};
    parts[i] = m[1];
  }
  return parts[0] + "." + parts[1] + "." + parts[2];
}

HeaderSearch search_cutlass_headers() {
  std::vector<std::pair<std::string, std::string>> candidates;  // folder, the place it came from
  std::vector<std::string> looked;
  if (const std::string v = env("MOEBLAZE_CUTLASS_INCLUDE"); !v.empty()) candidates.emplace_back(v, "MOEBLAZE_CUTLASS_INCLUDE");
  else looked.push_back("MOEBLAZE_CUTLASS_INCLUDE: not set");
  for (const auto& p : package_places())
    if (!p.cutlass_include.empty()) candidates.emplace_back(p.cutlass_include.string(), p.name);
#ifdef MOEBLAZE_CUTLASS_INCLUDE_DEFAULT
  candidates.emplace_back(MOEBLAZE_CUTLASS_INCLUDE_DEFAULT, "the nvidia-cutlass package found at build time");
#endif
  std::set<std::string> seen;
  for (const auto& [dir, from] : candidates) {
    if (!seen.insert(identity(dir)).second) continue;
    const std::string version = cutlass_header_version(dir);
    if (version == kCutlassVersion) return HeaderSearch{{dir}, from, ""};
    looked.push_back(fmt::format("{} (from {}): {}", dir, from,
                                 version.empty() ? "no cutlass/version.h" : "CUTLASS " + version + ", not " + kCutlassVersion));
  }
  if (candidates.empty()) looked.push_back("no nvidia-cutlass package found beside this library or in a Python environment");
  HeaderSearch none;
  none.error = fmt::format("CUTLASS {} headers not found (the kernel layer's kernels include CuTe). Looked in:{}\n"
                           "Install them with `pip install --no-deps nvidia-cutlass=={}.0`, or set "
                           "MOEBLAZE_CUTLASS_INCLUDE to a folder holding CUTLASS's cute/ and cutlass/ headers.",
                           kCutlassVersion, list(looked), kCutlassVersion);
  return none;
}

ToolchainPart to_part(const HeaderSearch& s) { return ToolchainPart{s.dirs, s.place, s.error}; }

}  // namespace

namespace nvrtc {

const Library& library() {
  std::lock_guard<std::mutex> lock(g_nvrtc_mutex);
  if (!g_nvrtc) {
    auto lib = std::make_unique<Library>();
    std::vector<std::string> looked;
    if (!find_nvrtc(*lib, looked)) throw Error(nvrtc_not_found(looked));
    g_nvrtc = std::move(lib);
  }
  return *g_nvrtc;
}

std::string Library::version() const {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

}  // namespace nvrtc

void register_package_dirs(const PackageDirs& dirs) {
  std::lock_guard<std::mutex> lock(g_registered_mutex);
  g_registered = dirs;
}

std::vector<std::string> find_cuda_include_dirs() {
  HeaderSearch s = search_cuda_headers();
  if (!s.error.empty()) throw Error(s.error);
  return s.dirs;
}

std::string find_cutlass_include_dir() {
  HeaderSearch s = search_cutlass_headers();
  if (!s.error.empty()) throw Error(s.error);
  return s.dirs.front();
}

ToolchainReport toolchain_report() {
  ToolchainReport r;
  try {
    const nvrtc::Library& lib = nvrtc::library();
    r.nvrtc = ToolchainPart{{lib.path}, lib.place, ""};
    r.nvrtc_version = lib.version();
  } catch (const Error& e) {
    r.nvrtc.error = e.what();
  }
  r.cuda_headers = to_part(search_cuda_headers());
  r.cutlass_headers = to_part(search_cutlass_headers());
  return r;
}

}  // namespace moeblaze
