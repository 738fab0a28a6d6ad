// KernelCache (SQLite) tests, no GPU: schema and pragmas, round trips, keys that must miss,
// corrupt blobs and files, foreign files, read-only and unusable paths, rollback of a failed
// write, eight processes writing at once, export/import, verify, gc and the summary.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include "cache/kernel_cache.hpp"

using namespace moeblaze;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMoebApplicationId = 0x4D4F4542;

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

std::vector<char> random_blob(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<char> b(n);
  for (char& c : b) c = char(rng() & 0xff);
  for (size_t i = 0; i < 256 && i < n; ++i) b[i] = char(i);  // every byte value, 0 included
  return b;
}

CachedBinary make_binary(const std::string& name, size_t bytes, unsigned seed) {
  CachedBinary b;
  b.key = fmt::format("gen=1;template=abc;kernel={};opts=-O3;arch=sm_90a;nvrtc=13.0", name);
  b.key_hash = key_hash(b.key);
  b.kernel_name = name;
  b.arch = "sm_90a";
  b.nvrtc_version = "13.0";
  b.cubin = random_blob(bytes, seed);
  b.registers = 168;
  b.spill_bytes = 4;
  b.static_smem = 1024;
  b.dynamic_smem = 196608;
  b.threads = 256;
  b.log = "ptxas info    : Used 168 registers";
  return b;
}

void check_same(const CachedBinary& a, const CachedBinary& b) {
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

TuningKey make_key(int64_t bucket = 1024, const std::string& shape = "E=8 K=2 d=64 n=32 swiglu") {
  TuningKey k;
  k.family = "up_proj";
  k.template_hash = "0123456789abcdef";
  k.shape = shape;
  k.token_bucket = bucket;
  k.device = "NVIDIA H200;cc=9.0;sms=132;driver=580";
  k.policy = "routing=router;l2=rotated";
  return k;
}

Measurement make_measurement(const TuningKey& k, const std::string& config, const std::string& status, double ms) {
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

Winner make_winner(const TuningKey& k, const std::string& config, double ms) {
  return Winner{k, config, ms, ms / 50, ms * 1.5, 0};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(f.good());
}

// The files PATH.corrupt-* beside `path` (moved-aside caches, without their -wal and -shm).
std::vector<fs::path> moved_aside(const std::string& path) {
  std::vector<fs::path> out;
  const std::string prefix = fs::path(path).filename().string() + ".corrupt-";
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    const std::string name = e.path().filename().string();
    const bool companion = name.ends_with("-wal") || name.ends_with("-shm");
    if (name.starts_with(prefix) && !companion) out.push_back(e.path());
  }
  return out;
}

// Opening `path` moves it aside with one notice; the fresh cache then works.
void check_moved_aside_and_fresh(const std::string& path, const std::string& words) {
  KernelCache c(path);
  REQUIRE(c.notices().size() == 1);
  const std::string& notice = c.notices()[0];
  INFO(notice);
  CHECK(contains(notice, path));
  CHECK(contains(notice, words));
  CHECK(contains(notice, "moved to " + path + ".corrupt-"));
  CHECK(contains(notice, "starting a fresh cache"));
  CHECK(moved_aside(path).size() == 1);
  const CachedBinary b = make_binary("mb_fresh", 1000, 7);
  c.put_binary(b);
  REQUIRE(c.find_binary(b.key_hash, b.key));
  CHECK(c.summary().binaries == 1);
  CHECK(c.verify(false).problems.empty());
}

// Whether this process can create files in a folder whatever its mode bits (root can).
bool permissions_enforced(const fs::path& folder) {
  const fs::path probe = folder / "probe";
  std::ofstream f(probe);
  const bool created = f.good();
  f.close();
  std::error_code ec;
  fs::remove(probe, ec);
  return !created;
}

template <class F>
std::string cache_error_of(F&& fn) {
  try {
    fn();
  } catch (const CacheError& e) {
    return e.what();
  }
  FAIL("expected CacheError");
  return "";
}

}  // namespace

TEST_CASE("cache: schema and pragmas on a fresh file") {
  TempDir dir;
  const std::string path = dir.file("a/b/kernels.db");  // folders are created
  {
    KernelCache c(path);
    CHECK(c.path() == path);
    CHECK(c.notices().empty());
    CHECK(c.summary().schema_version == kCacheSchemaVersion);
  }
  RawDb raw(path);
  CHECK(raw.integer("PRAGMA user_version") == kCacheSchemaVersion);
  CHECK(raw.integer("PRAGMA application_id") == kMoebApplicationId);
  CHECK(raw.text("PRAGMA journal_mode") == "wal");
  for (const char* table : {"binaries", "measurements", "winners"})
    CHECK(raw.integer(fmt::format("SELECT count(*) FROM sqlite_master WHERE type='table' AND name='{}'", table)) == 1);
  CHECK(raw.integer("SELECT count(*) FROM sqlite_master WHERE type='index' AND sql IS NOT NULL") >= 3);
  // Opening again neither migrates nor complains.
  KernelCache again(path);
  CHECK(again.notices().empty());
}

TEST_CASE("cache: key hash and tuning key text") {
  CHECK(key_hash("") == "cbf29ce484222325");  // FNV-1a 64 reference values
  CHECK(key_hash("a") == "af63dc4c8601ec8c");
  CHECK(key_hash("foobar") == "85944171f73967e8");
  const TuningKey base = make_key();
  CHECK(base.text() ==
        "family=up_proj;template=0123456789abcdef;shape=E=8 K=2 d=64 n=32 swiglu;bucket=1024;"
        "device=NVIDIA H200\\;cc=9.0\\;sms=132\\;driver=580;policy=routing=router\\;l2=rotated");
  CHECK(base.hash() == key_hash(base.text()));
  CHECK(base.hash().size() == 16);
  CHECK(base.hash().find_first_not_of("0123456789abcdef") == std::string::npos);
  std::vector<TuningKey> changed(6, base);
  changed[0].family = "down_proj";
  changed[1].template_hash = "0123456789abcdee";
  changed[2].shape += " ";
  changed[3].token_bucket = 2048;
  changed[4].device = "NVIDIA H100";
  changed[5].policy = "routing=balanced;l2=rotated";
  for (const TuningKey& k : changed) {
    CHECK(k.text() != base.text());
    CHECK(k.hash() != base.hash());
  }
  // Separators inside fields cannot make two different keys read the same.
  TuningKey a = base, b = base;
  a.family = "x;template=y";
  a.template_hash = "z";
  b.family = "x";
  b.template_hash = "y;template=z";
  CHECK(a.text() != b.text());
}

TEST_CASE("cache: binary round trip and misses") {
  TempDir dir;
  KernelCache c(dir.file("kernels.db"));
  const CachedBinary b = make_binary("mb_up_proj_E8_K2_d64_n32_swiglu_128x128x64_w2x4_s3", 100 * 1024, 1);
  c.put_binary(b);
  const auto found = c.find_binary(b.key_hash, b.key);
  REQUIRE(found);
  check_same(*found, b);

  // Same hash, other key: a miss, and the stored row is untouched.
  CHECK_FALSE(c.find_binary(b.key_hash, b.key + ";extra"));
  CHECK_FALSE(c.find_binary(b.key_hash, ""));
  CHECK(c.find_binary(b.key_hash, b.key));
  CHECK_FALSE(c.find_binary("0000000000000000", b.key));
  CHECK_FALSE(c.find_binary(key_hash("unknown"), "unknown"));

  // Insert or replace.
  CachedBinary b2 = b;
  b2.cubin = random_blob(5000, 2);
  b2.registers = 128;
  c.put_binary(b2);
  check_same(*c.find_binary(b.key_hash, b.key), b2);
  CHECK(c.summary().binaries == 1);

  // An empty binary is an empty blob, not NULL.
  CachedBinary empty = make_binary("mb_empty", 0, 3);
  c.put_binary(empty);
  REQUIRE(c.find_binary(empty.key_hash, empty.key));
  CHECK(c.find_binary(empty.key_hash, empty.key)->cubin.empty());
  CHECK(c.notices().empty());
}

TEST_CASE("cache: measurements are all kept, winners replaced per key") {
  TempDir dir;
  KernelCache c(dir.file("kernels.db"));
  const TuningKey k = make_key(1024), k2 = make_key(2048), other_shape = make_key(1024, "E=16 K=2 d=64 n=32 swiglu");
  c.add_measurements({make_measurement(k, "128x128x64_w2x4_s3", "ok", 1.5),
                      make_measurement(k, "128x256x64_w2x4_s4", "illegal", 0),
                      make_measurement(k, "64x128x64_w1x4_s3", "compile_failed", 0)});
  c.add_measurements({make_measurement(k, "128x128x64_w2x4_s3", "ok", 1.4),  // a second run of the same config
                      make_measurement(k2, "128x128x64_w2x4_s3", "wrong_result", 0)});
  c.add_measurements({});
  const auto ms = c.measurements(k.hash());
  REQUIRE(ms.size() == 4);
  CHECK(ms[0].config == "128x128x64_w2x4_s3");
  CHECK(ms[0].median_ms == doctest::Approx(1.5));
  CHECK(ms[0].spread_ms == doctest::Approx(0.015));
  CHECK(ms[0].samples == 10);
  CHECK(ms[0].created > 1.6e9);
  CHECK(ms[0].key.text() == k.text());
  CHECK(ms[1].status == "illegal");
  CHECK(ms[1].detail == "why: illegal");
  CHECK(ms[2].status == "compile_failed");
  CHECK(ms[3].median_ms == doctest::Approx(1.4));
  CHECK(c.measurements(k2.hash()).size() == 1);
  CHECK(c.measurements(key_hash("nothing")).empty());

  CHECK_FALSE(c.find_winner(k));
  c.put_winner(make_winner(k, "128x128x64_w2x4_s3", 1.5));
  c.put_winner(make_winner(k, "128x256x64_w2x4_s4", 1.2));  // replaces
  c.put_winner(make_winner(k2, "128x128x64_w2x4_s3", 2.5));
  c.put_winner(make_winner(other_shape, "64x128x64_w1x4_s3", 0.5));
  const auto w = c.find_winner(k);
  REQUIRE(w);
  CHECK(w->config == "128x256x64_w2x4_s4");
  CHECK(w->median_ms == doctest::Approx(1.2));
  CHECK(w->spread_ms == doctest::Approx(1.2 / 50));
  CHECK(w->default_ms == doctest::Approx(1.8));
  CHECK(w->key.text() == k.text());
  CHECK(w->created > 1.6e9);
  CHECK(c.all_winners().size() == 3);

  const auto same_shape = c.winners_for(k.family, k.template_hash, k.shape, k.device);
  REQUIRE(same_shape.size() == 2);
  CHECK(same_shape[0].key.token_bucket == 1024);  // ordered by bucket for the fallback
  CHECK(same_shape[1].key.token_bucket == 2048);
  CHECK(c.winners_for("down_proj", k.template_hash, k.shape, k.device).empty());
  CHECK(c.winners_for(k.family, "other", k.shape, k.device).empty());
  CHECK(c.winners_for(k.family, k.template_hash, other_shape.shape, k.device).size() == 1);
  CHECK(c.winners_for(k.family, k.template_hash, k.shape, "NVIDIA H100").empty());
  TuningKey other_policy = k;
  other_policy.policy = "routing=balanced;l2=rotated";
  CHECK_FALSE(c.find_winner(other_policy));
}

TEST_CASE("cache: a binary that fails its checksum is deleted with a notice") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  KernelCache c(path);
  const CachedBinary b = make_binary("mb_down_proj_x", 20000, 4);
  c.put_binary(b);
  std::vector<char> flipped = b.cubin;
  flipped[1000] = char(~flipped[1000]);
  flipped[19999] = char(flipped[19999] ^ 0x10);
  RawDb(path).set_cubin(b.key_hash, flipped);

  CHECK_FALSE(c.find_binary(b.key_hash, b.key));
  REQUIRE(c.notices().size() == 1);
  CHECK(contains(c.notices()[0], b.key_hash));
  CHECK(contains(c.notices()[0], "checksum"));
  CHECK(RawDb(path).integer("SELECT count(*) FROM binaries") == 0);
  c.put_binary(b);  // the caller rebuilds it
  CHECK(c.find_binary(b.key_hash, b.key));
}

TEST_CASE("cache: a corrupt file is moved aside and a fresh cache started") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  SUBCASE("random bytes, with -wal and -shm beside it") {
    const std::vector<char> noise = random_blob(8192, 5);
    write_file(path, std::string(noise.begin(), noise.end()));
    write_file(path + "-wal", "stale wal");
    write_file(path + "-shm", "stale shm");
    check_moved_aside_and_fresh(path, "file is not a database");
    const fs::path moved = moved_aside(path)[0];
    CHECK(fs::file_size(moved) == 8192);
    CHECK(fs::exists(moved.string() + "-wal"));
    CHECK(fs::exists(moved.string() + "-shm"));
  }
  SUBCASE("text") {
    write_file(path, "this is not a database\n");
    check_moved_aside_and_fresh(path, "corrupt");
  }
  SUBCASE("damaged pages in a real cache") {
    {
      KernelCache c(path);
      for (int i = 0; i < 20; ++i) c.put_binary(make_binary(fmt::format("mb_{}", i), 10000, unsigned(i)));
    }
    REQUIRE_FALSE(fs::exists(path + "-wal"));  // the last close checkpointed everything into the file
    const auto size = fs::file_size(path);
    const std::vector<char> noise = random_blob(size - 4096, 6);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);  // keep page 1 (the header) intact
    f.write(noise.data(), std::streamsize(noise.size()));
    f.close();
    check_moved_aside_and_fresh(path, "corrupt");
  }
}

TEST_CASE("cache: a foreign SQLite file is moved aside, intact") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  std::string words;
  SUBCASE("another application_id") {
    RawDb(path).exec("PRAGMA application_id = 305419896; CREATE TABLE t(x); INSERT INTO t VALUES (42);");
    words = "application_id 0x12345678";
  }
  SUBCASE("no application_id, but tables") {
    RawDb(path).exec("CREATE TABLE t(x); INSERT INTO t VALUES (42);");
    words = "not a moeblaze cache";
  }
  SUBCASE("a newer schema version") {
    { KernelCache c(path); }
    RawDb(path).exec(fmt::format("PRAGMA user_version = {}; CREATE TABLE t(x); INSERT INTO t VALUES (42);",
                                 kCacheSchemaVersion + 1));
    words = "newer";
  }
  check_moved_aside_and_fresh(path, words);
  RawDb moved(moved_aside(path)[0].string());
  CHECK(moved.integer("SELECT x FROM t") == 42);
}

TEST_CASE("cache: read-only opening reads and refuses writes") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  const CachedBinary b = make_binary("mb_ro", 3000, 8);
  const TuningKey k = make_key();
  {
    KernelCache c(path);
    c.put_binary(b);
    c.put_winner(make_winner(k, "128x128x64_w2x4_s3", 1.0));
  }
  KernelCache ro(path, true);
  REQUIRE(ro.find_binary(b.key_hash, b.key));
  CHECK(ro.find_winner(k));
  CHECK(ro.summary().binaries == 1);
  CHECK(ro.verify(false).problems.empty());
  for (const std::string& message :
       {cache_error_of([&] { ro.put_binary(b); }),
        cache_error_of([&] { ro.add_measurements({make_measurement(k, "c", "ok", 1)}); }),
        cache_error_of([&] { ro.put_winner(make_winner(k, "c", 1)); }), cache_error_of([&] { ro.gc(0); }),
        cache_error_of([&] { ro.import_from(path); })}) {
    CHECK(contains(message, "read-only"));
    CHECK(contains(message, path));
  }
  CHECK(ro.find_binary(b.key_hash, b.key));  // nothing changed

  // Read-only never creates, and never moves a bad file aside.
  const std::string missing = dir.file("missing.db");
  CHECK(contains(cache_error_of([&] { KernelCache m(missing, true); }), missing));
  CHECK_FALSE(fs::exists(missing));
  const std::string bad = dir.file("bad.db");
  write_file(bad, "this is not a database\n");
  CHECK(contains(cache_error_of([&] { KernelCache m(bad, true); }), "not a database"));
  CHECK(moved_aside(bad).empty());
}

TEST_CASE("cache: unusable paths throw CacheError naming the path and the reason") {
  TempDir dir;
  const std::string folder_path = dir.file("a_folder");
  fs::create_directories(folder_path);
  std::string message = cache_error_of([&] { KernelCache c(folder_path); });
  CHECK(contains(message, folder_path));
  CHECK(contains(message, "Is a directory"));

  write_file(dir.file("plain_file"), "x");
  message = cache_error_of([&] { KernelCache c(dir.file("plain_file") + "/kernels.db"); });
  CHECK(contains(message, dir.file("plain_file")));
  CHECK(contains(message, "Not a directory"));

  const fs::path locked = dir.path / "locked";
  fs::create_directories(locked);
  write_file((locked / "kernels.db").string(), "");
  fs::permissions(locked / "kernels.db", fs::perms::owner_read);
  fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);  // 0500
  if (!permissions_enforced(locked)) {
    MESSAGE("running as root: permissions are not enforced, unwritable-folder checks skipped");
  } else {
    message = cache_error_of([&] { KernelCache c((locked / "new.db").string()); });
    CHECK(contains(message, locked.string()));
    CHECK(contains(message, "Permission denied"));
    message = cache_error_of([&] { KernelCache c((locked / "deeper/new.db").string()); });
    CHECK(contains(message, locked.string()));
    const std::string read_only_file = dir.file("read_only_file.db");
    write_file(read_only_file, "");
    fs::permissions(read_only_file, fs::perms::owner_read);
    message = cache_error_of([&] { KernelCache c(read_only_file); });
    CHECK(contains(message, read_only_file));
    CHECK(contains(message, "Permission denied"));
  }
}

TEST_CASE("cache: a write that fails half-way leaves no partial rows") {
  // The second measurement breaks the CHECK on status inside the transaction, after the
  // first was inserted: the same rollback path as SQLITE_FULL (disk full) or an I/O error.
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  KernelCache c(path);
  const TuningKey k = make_key();
  const std::string message = cache_error_of([&] {
    c.add_measurements({make_measurement(k, "128x128x64_w2x4_s3", "ok", 1.0), make_measurement(k, "x", "bogus", 0)});
  });
  CHECK(contains(message, path));
  CHECK(contains(message, "CHECK constraint failed"));
  CHECK(c.measurements(k.hash()).empty());
  CHECK(c.summary().measurements == 0);
  // No transaction was left open: the next write works and is seen by another connection.
  c.add_measurements({make_measurement(k, "128x128x64_w2x4_s3", "ok", 1.0)});
  CHECK(RawDb(path).integer("SELECT count(*) FROM measurements") == 1);
}

TEST_CASE("cache: eight processes write at once") {
  constexpr int kProcesses = 8, kEach = 50;
  TempDir dir;
  const std::string path = dir.file("shared/kernels.db");  // created by whichever child comes first
  std::vector<pid_t> children;
  // No SQLite handle is open in this process here, so forking is safe.
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 0;
      try {
        KernelCache c(path);
        std::mt19937 rng{unsigned(p)};
        for (int i = 0; i < kEach; ++i) {
          const CachedBinary b = make_binary(fmt::format("mb_p{}_i{}", p, i), 2000 + 97 * size_t(i), unsigned(p * 1000 + i));
          c.put_binary(b);
          const TuningKey k = make_key(int64_t(p) * 1000 + i);
          c.add_measurements({make_measurement(k, "128x128x64_w2x4_s3", i % 5 ? "ok" : "run_failed", 1.0 + i)});
          // Reads in between: our own rows must be there, other processes' may or may not.
          if (!c.find_binary(b.key_hash, b.key) || c.measurements(k.hash()).size() != 1) throw CacheError("own row missing");
          const int q = int(rng() % kProcesses), j = int(rng() % kEach);
          const std::string other_key = make_binary(fmt::format("mb_p{}_i{}", q, j), 1, 0).key;
          if (auto o = c.find_binary(key_hash(other_key), other_key); o && o->kernel_name != fmt::format("mb_p{}_i{}", q, j))
            throw CacheError("wrong row for " + other_key);
          if (!c.notices().empty()) throw CacheError("notice: " + c.notices()[0]);
        }
      } catch (const std::exception& e) {
        write_file(dir.file(fmt::format("child-{}.err", p)), e.what());
        rc = 1;
      }
      _exit(rc);  // no doctest teardown, no atexit handlers in the child
    }
    children.push_back(pid);
  }
  for (int p = 0; p < kProcesses; ++p) {
    int status = 0;
    REQUIRE(waitpid(children[size_t(p)], &status, 0) == children[size_t(p)]);
    std::ifstream err(dir.file(fmt::format("child-{}.err", p)));
    std::stringstream why;
    why << err.rdbuf();
    CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "process " << p << ": " << why.str());
  }
  KernelCache c(path);
  const CacheSummary s = c.summary();
  CHECK(s.binaries == kProcesses * kEach);
  CHECK(s.measurements == kProcesses * kEach);
  CHECK(s.failures == kProcesses * kEach / 5);
  for (int p = 0; p < kProcesses; ++p)
    for (int i = 0; i < kEach; i += 7) {
      const CachedBinary b = make_binary(fmt::format("mb_p{}_i{}", p, i), 2000 + 97 * size_t(i), unsigned(p * 1000 + i));
      const auto found = c.find_binary(b.key_hash, b.key);
      REQUIRE(found);
      CHECK(found->cubin == b.cubin);
    }
  const VerifyReport v = c.verify(false);
  CHECK(v.integrity_ok);
  CHECK(v.binaries_checked == kProcesses * kEach);
  CHECK(v.bad_checksums == 0);
  CHECK(c.notices().empty());
}

TEST_CASE("cache: export and import round trip") {
  TempDir dir;
  KernelCache a(dir.file("a.db"));
  std::vector<CachedBinary> bins;
  for (int i = 0; i < 3; ++i) bins.push_back(make_binary(fmt::format("mb_export_{}", i), 5000 + size_t(i), unsigned(i)));
  for (const auto& b : bins) a.put_binary(b);
  const TuningKey k = make_key(), k2 = make_key(4096);
  a.add_measurements({make_measurement(k, "c1", "ok", 1.0), make_measurement(k, "c2", "illegal", 0),
                      make_measurement(k, "c3", "ok", 2.0), make_measurement(k2, "c1", "ok", 3.0),
                      make_measurement(k2, "c2", "wrong_result", 0)});
  a.put_winner(make_winner(k, "c1", 1.0));
  a.put_winner(make_winner(k2, "c1", 3.0));

  const std::string exported = dir.file("out/export.db");  // the folder is created
  a.export_to(exported);
  CHECK(fs::exists(exported));
  const std::string message = cache_error_of([&] { a.export_to(exported); });
  CHECK(contains(message, exported));

  KernelCache b(dir.file("b.db"));
  CHECK(b.import_from(exported) == 3 + 5 + 2);
  for (const auto& bin : bins) {
    const auto found = b.find_binary(bin.key_hash, bin.key);
    REQUIRE(found);
    check_same(*found, bin);
  }
  for (const TuningKey& key : {k, k2}) {
    const auto ma = a.measurements(key.hash()), mb = b.measurements(key.hash());
    REQUIRE(ma.size() == mb.size());
    for (size_t i = 0; i < ma.size(); ++i) {
      CHECK(ma[i].key.text() == mb[i].key.text());
      CHECK(ma[i].config == mb[i].config);
      CHECK(ma[i].status == mb[i].status);
      CHECK(ma[i].median_ms == mb[i].median_ms);
      CHECK(ma[i].detail == mb[i].detail);
      CHECK(ma[i].created == mb[i].created);
    }
    REQUIRE(b.find_winner(key));
    CHECK(b.find_winner(key)->config == a.find_winner(key)->config);
    CHECK(b.find_winner(key)->created == a.find_winner(key)->created);
  }
  const CacheSummary sa = a.summary(), sb = b.summary();
  CHECK(sb.binaries == sa.binaries);
  CHECK(sb.binary_bytes == sa.binary_bytes);
  CHECK(sb.measurements == sa.measurements);
  CHECK(sb.failures == sa.failures);
  CHECK(sb.winners == sa.winners);
  CHECK(b.verify(false).problems.empty());
}

TEST_CASE("cache: import rejects files that are not exports and changes nothing") {
  TempDir dir;
  KernelCache c(dir.file("kernels.db"));
  c.put_binary(make_binary("mb_keep", 100, 1));
  const CacheSummary before = c.summary();

  const std::string noise = dir.file("noise.db");
  const std::vector<char> bytes = random_blob(10000, 9);
  write_file(noise, std::string(bytes.begin(), bytes.end()));
  const std::string foreign = dir.file("foreign.db");
  RawDb(foreign).exec("CREATE TABLE binaries(x); INSERT INTO binaries VALUES (1);");
  const std::string missing = dir.file("missing.db");
  for (const std::string& file : {noise, foreign, missing}) {
    const std::string message = cache_error_of([&] { c.import_from(file); });
    CHECK(contains(message, "not a moeblaze cache export"));
    CHECK(contains(message, file));
  }
  const CacheSummary after = c.summary();
  CHECK(after.binaries == before.binaries);
  CHECK(after.measurements == before.measurements);
  CHECK(after.winners == before.winners);
  CHECK(c.verify(false).problems.empty());
}

TEST_CASE("cache: verify finds bad checksums and fixes them on request") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  KernelCache c(path);
  std::vector<CachedBinary> bins;
  for (int i = 0; i < 5; ++i) bins.push_back(make_binary(fmt::format("mb_v{}", i), 3000, unsigned(i)));
  for (const auto& b : bins) c.put_binary(b);
  {
    RawDb raw(path);
    raw.set_cubin(bins[1].key_hash, random_blob(3000, 99));
    raw.set_cubin(bins[3].key_hash, std::vector<char>(bins[3].cubin.begin(), bins[3].cubin.begin() + 100));  // truncated
  }
  VerifyReport r = c.verify(false);
  CHECK(r.integrity_ok);
  CHECK(r.binaries_checked == 5);
  CHECK(r.bad_checksums == 2);
  CHECK(r.problems.size() == 2);
  CHECK(c.summary().binaries == 5);  // reported only
  r = c.verify(true);
  CHECK(r.bad_checksums == 2);
  CHECK(c.summary().binaries == 3);
  r = c.verify(false);
  CHECK(r.binaries_checked == 3);
  CHECK(r.problems.empty());
  CHECK(c.find_binary(bins[0].key_hash, bins[0].key));
}

TEST_CASE("cache: gc deletes unreferenced binaries first, oldest first") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  KernelCache c(path);
  // b0 and b1 (the oldest) are named by winners; b2..b5 are not.
  const std::vector<std::string> configs = {"128x128x64_w2x4_s3", "128x256x64_w2x4_s4", "64x128x64_w1x4_s3",
                                            "128x128x64_w2x4_s5", "256x128x64_w4x2_s3", "64x64x64_w1x2_s2"};
  std::vector<CachedBinary> bins;
  for (int i = 0; i < 6; ++i) {
    bins.push_back(make_binary("mb_up_proj_E8_K2_d64_n32_swiglu_" + configs[size_t(i)], 10000, unsigned(i)));
    c.put_binary(bins.back());
  }
  c.put_winner(make_winner(make_key(1024), configs[0], 1.0));
  c.put_winner(make_winner(make_key(2048), configs[1], 1.0));
  {
    RawDb raw(path);
    for (int i = 0; i < 6; ++i)
      raw.exec(fmt::format("UPDATE binaries SET last_used = {} WHERE key_hash = '{}'", 1000 + i, bins[size_t(i)].key_hash));
  }
  auto present = [&] {
    std::string s;
    for (int i = 0; i < 6; ++i) s += c.find_binary(bins[size_t(i)].key_hash, bins[size_t(i)].key) ? '1' : '0';
    return s;
  };
  CHECK(c.gc(1 << 30) == 0);
  CHECK(c.gc(40000) == 2);  // 60 000 bytes -> 40 000: the two oldest unreferenced ones
  CHECK(c.summary().binary_bytes == 40000);
  CHECK(c.gc(15000) == 3);  // b4, b5, then the oldest referenced one, b0
  CHECK(present() == "010000");
  CHECK(c.gc(0) == 1);
  const CacheSummary s = c.summary();
  CHECK(s.binaries == 0);
  CHECK(s.binary_bytes == 0);
  CHECK(s.winners == 2);  // gc touches binaries only
}

TEST_CASE("cache: summary numbers add up") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  KernelCache c(path);
  int64_t bytes = 0;
  for (int i = 0; i < 4; ++i) {
    const CachedBinary b = make_binary(fmt::format("mb_s{}", i), 1000 * size_t(i + 1), unsigned(i));
    bytes += int64_t(b.cubin.size());
    c.put_binary(b);
  }
  const TuningKey k = make_key();
  c.add_measurements({make_measurement(k, "a", "ok", 1), make_measurement(k, "b", "illegal", 0),
                      make_measurement(k, "c", "run_failed", 0), make_measurement(k, "d", "ok", 2)});
  c.put_winner(make_winner(k, "a", 1));
  const CacheSummary s = c.summary();
  CHECK(s.path == path);
  CHECK(s.schema_version == kCacheSchemaVersion);
  CHECK(s.binaries == 4);
  CHECK(s.binary_bytes == bytes);
  CHECK(s.measurements == 4);
  CHECK(s.failures == 2);
  CHECK(s.winners == 1);
  CHECK(s.file_bytes >= bytes);
}

TEST_CASE("cache: default path follows MOEBLAZE_CACHE, XDG_CACHE_HOME, HOME") {
  struct SavedEnv {
    std::string name;
    std::optional<std::string> value;
    explicit SavedEnv(const char* n) : name(n) {
      if (const char* v = std::getenv(n)) value = v;
    }
    ~SavedEnv() { value ? setenv(name.c_str(), value->c_str(), 1) : unsetenv(name.c_str()); }
  } saved[] = {SavedEnv("MOEBLAZE_CACHE"), SavedEnv("XDG_CACHE_HOME"), SavedEnv("HOME")};
  setenv("MOEBLAZE_CACHE", "/x/cache.db", 1);
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  setenv("HOME", "/home/u", 1);
  CHECK(KernelCache::default_path() == "/x/cache.db");
  unsetenv("MOEBLAZE_CACHE");
  CHECK(KernelCache::default_path() == "/xdg/moeblaze/kernels.db");
  setenv("XDG_CACHE_HOME", "", 1);
  CHECK(KernelCache::default_path() == "/home/u/.cache/moeblaze/kernels.db");
  unsetenv("HOME");
  unsetenv("XDG_CACHE_HOME");
  CHECK_THROWS_AS(KernelCache::default_path(), CacheError);
}
