#include "nvrtc_compiler.hpp"

#include <fmt/format.h>
#include <nvrtc.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "core/errors.hpp"
#include "cubin_code.hpp"
#include "generator/embedded_templates.hpp"
#include "generator/kernel_spec.hpp"

namespace moeblaze {
namespace {

// RAII for nvrtcProgram.
class Program {
 public:
  Program(const KernelSource& src) {
    const auto& headers = embedded_templates();
    std::vector<const char*> texts, names;
    for (const auto& h : headers) {
      texts.push_back(h.text);
      names.push_back(h.name);
    }
    check(nvrtcCreateProgram(&prog_, src.text.c_str(), src.file_name.c_str(), static_cast<int>(texts.size()),
                             texts.data(), names.data()),
          "nvrtcCreateProgram");
  }
  ~Program() {
    if (prog_) nvrtcDestroyProgram(&prog_);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return prog_; }
  std::string log() const {
    size_t n = 0;
    if (nvrtcGetProgramLogSize(prog_, &n) != NVRTC_SUCCESS || n == 0) return {};
    std::string s(n, '\0');
    nvrtcGetProgramLog(prog_, s.data());
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
  }
  static void check(nvrtcResult r, const char* call) {
    if (r != NVRTC_SUCCESS) throw Error(fmt::format("{} failed: {}", call, nvrtcGetErrorString(r)));
  }

 private:
  nvrtcProgram prog_ = nullptr;
};

bool has_bf16_header(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / "cuda_bf16.h", ec);
}

}  // namespace

std::string find_cuda_include_dir() {
  std::vector<std::string> tried;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* v = std::getenv(var); v && *v) {
      const auto dir = std::filesystem::path(v) / "include";
      if (has_bf16_header(dir)) return dir.string();
      tried.push_back(fmt::format("{}/include (from {})", v, var));
    }
  }
  for (const char* prefix : {"/usr/local/cuda", "/usr/local/cuda-13.0", "/usr/lib/cuda"}) {
    const auto dir = std::filesystem::path(prefix) / "include";
    if (has_bf16_header(dir)) return dir.string();
    tried.push_back(dir.string());
  }
  std::string list;
  for (const auto& t : tried) list += "\n  " + t;
  throw Error("CUDA headers not found (no cuda_bf16.h). Looked in:" + list +
              "\nSet CUDA_HOME to the CUDA 13 toolkit folder.");
}

namespace {
// "4.2.0" from cutlass/version.h's CUTLASS_MAJOR / _MINOR / _PATCH; empty when unreadable.
std::string cutlass_header_version(const std::filesystem::path& include_dir) {
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
}  // namespace

std::string find_cutlass_include_dir() {
  std::vector<std::pair<std::string, std::string>> candidates;  // folder, where it came from
  if (const char* v = std::getenv("MOEBLAZE_CUTLASS_INCLUDE"); v && *v) candidates.emplace_back(v, "MOEBLAZE_CUTLASS_INCLUDE");
#ifdef MOEBLAZE_CUTLASS_INCLUDE_DEFAULT
  candidates.emplace_back(MOEBLAZE_CUTLASS_INCLUDE_DEFAULT, "the nvidia-cutlass package found at build time");
#endif
  std::string tried;
  for (const auto& [dir, from] : candidates) {
    const std::string version = cutlass_header_version(dir);
    if (version == kCutlassVersion) return dir;
    tried += fmt::format("\n  {} (from {}): {}", dir, from,
                         version.empty() ? "no cutlass/version.h" : "CUTLASS " + version + ", not " + kCutlassVersion);
  }
  throw Error(fmt::format("CUTLASS {} headers not found (the kernel layer's kernels include CuTe).{}\n"
                          "Install them with `python3 -m pip install --no-deps nvidia-cutlass=={}.0` and set "
                          "MOEBLAZE_CUTLASS_INCLUDE to its cutlass_library/source/include folder.",
                          kCutlassVersion, tried.empty() ? "\n  (no MOEBLAZE_CUTLASS_INCLUDE, no build-time default)" : tried,
                          kCutlassVersion));
}

ResourceReport parse_resource_report(const std::string& log, const std::string& kernel_name) {
  ResourceReport r;
  // ptxas prints a "Function properties for NAME" block followed by the stack/spill line,
  // then a "Used N registers ... bytes smem" line for the entry function.
  const size_t at = log.find("Function properties for " + kernel_name);
  const std::string tail = at == std::string::npos ? log : log.substr(at);
  std::smatch m;
  static const std::regex stack(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  if (std::regex_search(tail, m, stack)) {
    r.stack_bytes = std::stoi(m[1]);
    r.spill_store_bytes = std::stoi(m[2]);
    r.spill_load_bytes = std::stoi(m[3]);
  }
  static const std::regex regs(R"(Used (\d+) registers)");
  if (std::regex_search(tail, m, regs)) r.registers = std::stoi(m[1]);
  static const std::regex smem(R"((\d+) bytes smem)");
  if (std::regex_search(tail, m, smem)) r.static_smem_bytes = std::stoi(m[1]);
  return r;
}

ResourceReport kernel_resources(const std::string& log, const std::vector<char>& cubin, const std::string& kernel_name) {
  ResourceReport r = parse_resource_report(log, kernel_name);
  r.code_bytes = kernel_code_bytes(cubin, kernel_name);
  return r;
}

CompiledKernel compile_kernel(const KernelSource& source, const CompileOptions& options) {
  const std::string inc = find_cuda_include_dir();
  std::vector<std::string> opts = {
      "--gpu-architecture=" + to_string(options.arch),
      "-std=c++17",
      "-I" + inc,
      "-I" + inc + "/cccl",
      "--ptxas-options=-v",
      "-default-device",
      "-lineinfo",
      "-DNDEBUG",
  };
  if (source.needs_cutlass) opts.push_back("-I" + find_cutlass_include_dir());
  opts.insert(opts.end(), options.extra.begin(), options.extra.end());
  std::vector<const char*> argv;
  for (const auto& o : opts) argv.push_back(o.c_str());

  const auto t0 = std::chrono::steady_clock::now();
  Program prog(source);
  const nvrtcResult r = nvrtcCompileProgram(prog.get(), static_cast<int>(argv.size()), argv.data());
  const std::string log = prog.log();
  if (r != NVRTC_SUCCESS) {
    std::string opt_line;
    for (const auto& o : opts) opt_line += " " + o;
    throw CompileError(source.kernel_name, log, source.text, opts,
                       fmt::format("NVRTC could not compile kernel {} ({}): {}\noptions:{}\nlog:\n{}",
                                   source.kernel_name, source.file_name, nvrtcGetErrorString(r), opt_line, log));
  }
  CompiledKernel out;
  out.kernel_name = source.kernel_name;
  out.arch = to_string(options.arch);
  size_t n = 0;
  Program::check(nvrtcGetCUBINSize(prog.get(), &n), "nvrtcGetCUBINSize");
  out.cubin.resize(n);
  Program::check(nvrtcGetCUBIN(prog.get(), out.cubin.data()), "nvrtcGetCUBIN");
  if (options.keep_ptx) {
    size_t p = 0;
    Program::check(nvrtcGetPTXSize(prog.get(), &p), "nvrtcGetPTXSize");
    out.ptx.resize(p);
    Program::check(nvrtcGetPTX(prog.get(), out.ptx.data()), "nvrtcGetPTX");
    while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();  // the size counts the terminator
  }
  out.log = log;
  out.options = std::move(opts);
  out.resources = kernel_resources(log, out.cubin, out.kernel_name);
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

}  // namespace moeblaze
