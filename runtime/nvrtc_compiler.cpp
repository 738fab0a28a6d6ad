#include "nvrtc_compiler.hpp"

#include <fmt/format.h>
#include <nvrtc.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
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
