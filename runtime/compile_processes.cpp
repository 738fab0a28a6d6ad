#include "compile_processes.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/errors.hpp"
#include "core/parallel.hpp"

namespace moeblaze {
namespace {

std::atomic<bool> in_processes{false};

// ---- the child's report: a tag, then length-prefixed fields ----------------------------

enum class Outcome : uint8_t { compiled = 1, compile_error = 2, error = 3 };

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }
void put_bytes(std::string& out, const char* p, size_t n) {
  put_u64(out, n);
  out.append(p, n);
}
void put_str(std::string& out, const std::string& s) { put_bytes(out, s.data(), s.size()); }
void put_strs(std::string& out, const std::vector<std::string>& v) {
  put_u64(out, v.size());
  for (const std::string& s : v) put_str(out, s);
}

// Reads what put_* wrote; false once the report is short (a child that died mid-write).
class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  bool u64(uint64_t& v) {
    if (s_.size() - at_ < sizeof v) return false;
    std::memcpy(&v, s_.data() + at_, sizeof v);
    at_ += sizeof v;
    return true;
  }
  bool str(std::string& v) {
    uint64_t n;
    if (!u64(n) || s_.size() - at_ < n) return false;
    v.assign(s_.data() + at_, n);
    at_ += n;
    return true;
  }
  bool bytes(std::vector<char>& v) {
    std::string s;
    if (!str(s)) return false;
    v.assign(s.begin(), s.end());
    return true;
  }
  bool strs(std::vector<std::string>& v) {
    uint64_t n;
    if (!u64(n) || n > s_.size()) return false;
    v.resize(n);
    for (std::string& s : v)
      if (!str(s)) return false;
    return true;
  }
  bool done() const { return at_ == s_.size(); }

 private:
  const std::string& s_;
  size_t at_ = 0;
};

std::string encode(const CompiledKernel& k) {
  std::string out(1, static_cast<char>(Outcome::compiled));
  put_str(out, k.kernel_name);
  put_str(out, k.arch);
  put_bytes(out, k.cubin.data(), k.cubin.size());
  put_str(out, k.ptx);
  put_str(out, k.log);
  put_strs(out, k.options);
  uint64_t ms;
  std::memcpy(&ms, &k.compile_ms, sizeof ms);
  put_u64(out, ms);
  return out;
}

std::string encode(const CompileError& e) {
  std::string out(1, static_cast<char>(Outcome::compile_error));
  put_str(out, e.kernel_name);
  put_str(out, e.log);
  put_strs(out, e.options);
  put_str(out, e.what());
  return out;
}

std::string encode_error(const char* what) {
  std::string out(1, static_cast<char>(Outcome::error));
  put_str(out, what);
  return out;
}

// The child's whole life: compile, report, exit without running this program's exit handlers.
[[noreturn]] void child_compiles(const KernelSource& source, const CompileOptions& options, int fd) {
  std::string report;
  try {
    report = encode(compile_kernel(source, options));
  } catch (const CompileError& e) {
    report = encode(e);
  } catch (const std::exception& e) {
    report = encode_error(e.what());
  } catch (...) {
    report = encode_error("unknown exception");
  }
  for (size_t at = 0; at < report.size();) {
    const ssize_t n = ::write(fd, report.data() + at, report.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(3);
    at += static_cast<size_t>(n);
  }
  ::_exit(0);
}

struct Running {
  pid_t pid;
  int fd;
  size_t index;
  std::string report;
};

std::string how_it_ended(int status) {
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return "ended";
}

int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// The kernel or the exception of a finished child's report.
std::pair<CompiledKernel*, std::exception_ptr> decode(const Running& r, const KernelSource& source, int status,
                                                      CompiledKernel& slot) {
  const std::string& s = r.report;
  auto died = [&] {
    return std::make_exception_ptr(Error(fmt::format(
        "the process compiling kernel {} {} before it reported (NVRTC out of memory is the usual cause)",
        source.kernel_name, how_it_ended(status))));
  };
  if (s.empty()) return {nullptr, died()};
  const std::string body = s.substr(1);  // after the tag
  Reader rd(body);
  switch (static_cast<Outcome>(s[0])) {
    case Outcome::compiled: {
      uint64_t ms;
      if (!rd.str(slot.kernel_name) || !rd.str(slot.arch) || !rd.bytes(slot.cubin) || !rd.str(slot.ptx) ||
          !rd.str(slot.log) || !rd.strs(slot.options) || !rd.u64(ms) || !rd.done())
        return {nullptr, died()};
      std::memcpy(&slot.compile_ms, &ms, sizeof ms);
      slot.resources = kernel_resources(slot.log, slot.cubin, slot.kernel_name);
      return {&slot, nullptr};
    }
    case Outcome::compile_error: {
      std::string kernel, log, what;
      std::vector<std::string> opts;
      if (!rd.str(kernel) || !rd.str(log) || !rd.strs(opts) || !rd.str(what) || !rd.done()) return {nullptr, died()};
      return {nullptr, std::make_exception_ptr(CompileError(kernel, log, source.text, opts, what))};
    }
    case Outcome::error: {
      std::string what;
      if (!rd.str(what) || !rd.done()) return {nullptr, died()};
      return {nullptr, std::make_exception_ptr(Error(what))};
    }
  }
  return {nullptr, died()};
}

}  // namespace

void set_compile_in_processes(bool on) { in_processes.store(on); }
bool compile_in_processes() { return in_processes.load(); }

unsigned default_compile_processes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const double gib = pages > 0 && page > 0 ? double(pages) * double(page) / double(1ull << 30) : 0;
  const unsigned by_memory = gib > 0 ? std::max(1u, static_cast<unsigned>(gib / 3.0)) : 1u;
  return std::max(1u, std::min(hardware_threads(), by_memory));
}

void compile_forked(const std::vector<const KernelSource*>& sources, const std::vector<CompileOptions>& options,
                    unsigned processes, const CompileDone& done) {
  if (sources.size() != options.size())
    throw InvalidArgument("options", fmt::format("{} compile options for {} sources", options.size(), sources.size()));
  if (processes == 0) processes = default_compile_processes();
  // Open NVRTC once here: the children inherit the loaded library. Where it cannot be found,
  // each child reports that as its kernel's error.
  try {
    (void)nvrtc_version();
  } catch (...) {
  }
  std::vector<Running> running;
  size_t next = 0;
  std::exception_ptr failure;  // from `done`: stop starting children, wait for the rest, rethrow
  auto finish = [&](size_t index, CompiledKernel* kernel, std::exception_ptr error) {
    if (failure) return;
    try {
      done(index, kernel, error);
    } catch (...) {
      failure = std::current_exception();
    }
  };
  auto compile_here = [&](size_t i) {
    CompiledKernel k;
    std::exception_ptr error;
    try {
      k = compile_kernel(*sources[i], options[i]);
    } catch (...) {
      error = std::current_exception();
    }
    finish(i, error ? nullptr : &k, error);
  };
  while ((next < sources.size() && !failure) || !running.empty()) {
    while (!failure && next < sources.size() && running.size() < processes) {
      const size_t i = next++;
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) {
        compile_here(i);
        continue;
      }
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(fds[0]);
        child_compiles(*sources[i], options[i], fds[1]);
      }
      ::close(fds[1]);
      if (pid < 0) {
        ::close(fds[0]);
        compile_here(i);
        continue;
      }
      running.push_back(Running{pid, fds[0], i, {}});
    }
    if (running.empty()) continue;
    std::vector<pollfd> polled;
    for (const Running& r : running) polled.push_back(pollfd{r.fd, POLLIN, 0});
    if (::poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("poll on the compiling processes failed: {}", std::strerror(errno)));
    }
    for (size_t p = polled.size(); p-- > 0;) {
      if (!(polled[p].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Running& r = running[p];
      char buf[1 << 16];
      const ssize_t n = ::read(r.fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        r.report.append(buf, static_cast<size_t>(n));
        continue;
      }
      ::close(r.fd);  // end of the report
      const int status = wait_for(r.pid);
      CompiledKernel slot;
      const auto [kernel, error] = decode(r, *sources[r.index], status, slot);
      const size_t index = r.index;
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(p));
      finish(index, kernel, error);
      if (failure)  // nothing more is wanted: the rest end now, and are waited for above
        for (const Running& other : running) ::kill(other.pid, SIGKILL);
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace moeblaze
