#include "nvrtc_compiler.hpp"

#include <fmt/format.h>

#include <chrono>
#include <regex>

#include "core/errors.hpp"
#include "cubin_code.hpp"
#include "generator/embedded_templates.hpp"
#include "generator/kernel_spec.hpp"
#include "nvrtc_library.hpp"

namespace moeblaze {
namespace {

// RAII for an NVRTC program.
class Program {
 public:
  Program(const nvrtc::Library& lib, const KernelSource& src) : lib_(lib) {
    const auto& headers = embedded_templates();
    std::vector<const char*> texts, names;
    for (const auto& h : headers) {
      texts.push_back(h.text);
      names.push_back(h.name);
    }
    check(lib_.nvrtcCreateProgram(&prog_, src.text.c_str(), src.file_name.c_str(), static_cast<int>(texts.size()),
                                  texts.data(), names.data()),
          "nvrtcCreateProgram");
  }
  ~Program() {
    if (prog_) lib_.nvrtcDestroyProgram(&prog_);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtc::Program get() const { return prog_; }
  std::string log() const {
    size_t n = 0;
    if (lib_.nvrtcGetProgramLogSize(prog_, &n) != nvrtc::kSuccess || n == 0) return {};
    std::string s(n, '\0');
    lib_.nvrtcGetProgramLog(prog_, s.data());
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
  }
  void check(nvrtc::Result r, const char* call) const {
    if (r != nvrtc::kSuccess) throw Error(fmt::format("{} failed: {}", call, lib_.nvrtcGetErrorString(r)));
  }

 private:
  const nvrtc::Library& lib_;
  nvrtc::Program prog_ = nullptr;
};

}  // namespace

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
  const nvrtc::Library& lib = nvrtc::library();
  std::vector<std::string> opts = {
      "--gpu-architecture=" + to_string(options.arch),
      "-std=c++17",
  };
  for (const std::string& dir : find_cuda_include_dirs()) opts.push_back("-I" + dir);
  opts.insert(opts.end(), {"--ptxas-options=-v", "-default-device", "-lineinfo", "-DNDEBUG"});
  if (source.needs_cutlass) opts.push_back("-I" + find_cutlass_include_dir());
  opts.insert(opts.end(), options.extra.begin(), options.extra.end());
  std::vector<const char*> argv;
  for (const auto& o : opts) argv.push_back(o.c_str());

  const auto t0 = std::chrono::steady_clock::now();
  Program prog(lib, source);
  const nvrtc::Result r = lib.nvrtcCompileProgram(prog.get(), static_cast<int>(argv.size()), argv.data());
  const std::string log = prog.log();
  if (r != nvrtc::kSuccess) {
    std::string opt_line;
    for (const auto& o : opts) opt_line += " " + o;
    throw CompileError(source.kernel_name, log, source.text, opts,
                       fmt::format("NVRTC could not compile kernel {} ({}): {}\noptions:{}\nlog:\n{}",
                                   source.kernel_name, source.file_name, lib.nvrtcGetErrorString(r), opt_line, log));
  }
  CompiledKernel out;
  out.kernel_name = source.kernel_name;
  out.arch = to_string(options.arch);
  size_t n = 0;
  prog.check(lib.nvrtcGetCUBINSize(prog.get(), &n), "nvrtcGetCUBINSize");
  out.cubin.resize(n);
  prog.check(lib.nvrtcGetCUBIN(prog.get(), out.cubin.data()), "nvrtcGetCUBIN");
  if (options.keep_ptx) {
    size_t p = 0;
    prog.check(lib.nvrtcGetPTXSize(prog.get(), &p), "nvrtcGetPTXSize");
    out.ptx.resize(p);
    prog.check(lib.nvrtcGetPTX(prog.get(), out.ptx.data()), "nvrtcGetPTX");
    while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();  // the size counts the terminator
  }
  out.log = log;
  out.options = std::move(opts);
  out.resources = kernel_resources(log, out.cubin, out.kernel_name);
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::string nvrtc_version() { return nvrtc::library().version(); }

}  // namespace moeblaze
