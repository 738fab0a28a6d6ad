// Helpers of the cache tests (test_cache.cpp, test_cache_import.cpp): temporary folders, a
// raw SQLite connection to look behind the cache's back and damage files on purpose, rows
// with random contents, and running a check as an unprivileged user.
#pragma once
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <grp.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"

namespace cache_test {

using namespace moeblaze;
namespace fs = std::filesystem;

inline constexpr int64_t kMoebApplicationId = 0x4D4F4542;

// A fresh folder under the system temp folder, removed (permissions restored) at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path = fs::temp_directory_path() / fmt::format("moeblaze-cache-test-{}-{}-{:08x}", getpid(), counter++, rd());
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// A plain sqlite3 connection, to look behind the cache's back and to damage it on purpose.
class RawDb {
 public:
  explicit RawDb(const std::string& path) { REQUIRE(sqlite3_open(path.c_str(), &db_) == SQLITE_OK); }
  ~RawDb() { sqlite3_close(db_); }
  void exec(const std::string& sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    INFO(sql << ": " << (err ? err : ""));
    sqlite3_free(err);
    REQUIRE(rc == SQLITE_OK);
  }
  std::string text(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    REQUIRE(sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr) == SQLITE_OK);
    std::string out;
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0))
      out = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    return out;
  }
  int64_t integer(const std::string& sql) { return std::stoll(text(sql)); }
  // Replaces the cubin of one binary with `blob` (used to corrupt it).
  void set_cubin(const std::string& key_hash, const std::vector<char>& blob) {
    sqlite3_stmt* s = nullptr;
    REQUIRE(sqlite3_prepare_v2(db_, "UPDATE binaries SET cubin = ? WHERE key_hash = ?", -1, &s, nullptr) == SQLITE_OK);
    sqlite3_bind_blob(s, 1, blob.data(), int(blob.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, key_hash.c_str(), -1, SQLITE_TRANSIENT);
    CHECK(sqlite3_step(s) == SQLITE_DONE);
    sqlite3_finalize(s);
    CHECK(sqlite3_changes(db_) == 1);
  }

 private:
  sqlite3* db_ = nullptr;
};

inline std::vector<char> random_blob(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<char> b(n);
  for (char& c : b) c = char(rng() & 0xff);
  for (size_t i = 0; i < 256 && i < n; ++i) b[i] = char(i);  // every byte value, 0 included
  return b;
}

inline CachedBinary make_binary(const std::string& name, size_t bytes, unsigned seed) {
  CachedBinary b;
  b.key = fmt::format("gen=1;template=abc;kernel={};opts=-O3;arch=sm_90a;nvrtc=13.0", name);
  b.key_hash = key_hash(b.key);
  b.kernel_name = name;
  b.arch = "sm_90a";
  b.nvrtc_version = "13.0";
  b.cubin = random_blob(bytes, seed);
  for (size_t i = 0; i < 4 && i < b.cubin.size(); ++i) b.cubin[i] = "\x7f" "ELF"[i];  // imports accept ELF files only
  b.registers = 168;
  b.spill_bytes = 4;
  b.static_smem = 1024;
  b.dynamic_smem = 196608;
  b.threads = 256;
  b.log = "ptxas info    : Used 168 registers";
  return b;
}

inline void check_same(const CachedBinary& a, const CachedBinary& b) {
  CHECK(a.key_hash == b.key_hash);
  CHECK(a.key == b.key);
  CHECK(a.kernel_name == b.kernel_name);
  CHECK(a.arch == b.arch);
  CHECK(a.nvrtc_version == b.nvrtc_version);
  CHECK(a.cubin == b.cubin);
  CHECK(a.registers == b.registers);
  CHECK(a.spill_bytes == b.spill_bytes);
  CHECK(a.static_smem == b.static_smem);
  CHECK(a.dynamic_smem == b.dynamic_smem);
  CHECK(a.threads == b.threads);
  CHECK(a.log == b.log);
}

inline TuningKey make_key(int64_t bucket = 1024, const std::string& shape = "E=8 K=2 d=64 n=32 swiglu") {
  TuningKey k;
  k.family = "gate_up";
  k.template_hash = "0123456789abcdef";
  k.shape = shape;
  k.token_bucket = bucket;
  k.device = "NVIDIA H200;cc=9.0;sms=132;driver=580";
  k.policy = "routing=router;l2=rotated";
  return k;
}

inline Measurement make_measurement(const TuningKey& k, const std::string& config, const std::string& status, double ms) {
  Measurement m;
  m.key = k;
  m.config = config;
  m.status = status;
  m.median_ms = ms;
  m.spread_ms = ms / 100;
  m.samples = status == "ok" ? 10 : 0;
  m.detail = status == "ok" ? "" : "why: " + status;
  return m;
}

inline Winner make_winner(const TuningKey& k, const std::string& config, double ms) {
  return Winner{k, config, ms, ms / 50, ms * 1.5, 0};
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(f.good());
}

// Whether this process can create files in a folder whatever its mode bits (root can).
inline bool permissions_enforced(const fs::path& folder) {
  const fs::path probe = folder / "probe";
  std::ofstream f(probe);
  const bool created = f.good();
  f.close();
  std::error_code ec;
  fs::remove(probe, ec);
  return !created;
}

template <class F>
inline std::string cache_error_of(F&& fn) {
  try {
    fn();
  } catch (const CacheError& e) {
    return e.what();
  }
  FAIL("expected CacheError");
  return "";
}

// The message of the CacheError `fn` throws ("" when it throws none), without doctest
// assertions: for checks that run in a child process.
template <class F>
inline std::string cache_error_of_quiet(F&& fn) {
  try {
    fn();
  } catch (const CacheError& e) {
    return e.what();
  }
  return "";
}

// The whole file, to compare before and after (a refused file must not change by a byte).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs `check` in a child process, as user and group nobody (65534) when as_nobody and this
// process is root (root reads and writes whatever the mode bits say, so read-only files need
// another user), else as this user; the child is killed after 30 s (a check that would block
// fails instead of hanging the suite). `check` returns "" when it passed, else what failed.
// The child never runs doctest assertions: it reports through a pipe.
inline std::string run_in_child(const std::function<std::string()>& check, bool as_nobody = true) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    alarm(30);
    std::string out;
    if (as_nobody && getuid() == 0 && (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0)) out = "cannot drop to nobody";
    if (out.empty()) {
      try {
        out = check();
      } catch (const std::exception& e) {
        out = std::string("threw: ") + e.what();
      }
    }
    if (!out.empty() && write(fds[1], out.data(), out.size()) < 0) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) out += fmt::format(" (the child died by signal {})", WTERMSIG(status));
  return out;
}

}  // namespace cache_test
