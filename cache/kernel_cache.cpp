// SQLite implementation of KernelCache (kernel_cache.hpp is the contract, docs/design.md
// "Cache keys" the practice). One connection per KernelCache, every public write one BEGIN
// IMMEDIATE transaction that is rolled back on any error, every sqlite3 return code checked.
#include "cache/kernel_cache_sqlite.hpp"

#include <fmt/format.h>
#include <sqlite3.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "core/hash.hpp"

namespace moeblaze {
namespace fs = std::filesystem;
using namespace cache_detail;

namespace {

// Schema v1. cache_file holds the file's random id and its count of write transactions
// (kernel_cache_wal.cpp: whose -wal it is); a file made before it gets it when first opened
// for writing and stays version 1 (older builds read the other tables as before). Timings may
// be NULL: SQLite stores a NaN as NULL, and a failed candidate may have no time. The CHECK on
// status makes a bad measurement fail inside its transaction.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE cache_file(id TEXT NOT NULL, writes INTEGER NOT NULL);
CREATE TABLE binaries(
  key_hash TEXT PRIMARY KEY NOT NULL, key TEXT NOT NULL, kernel_name TEXT NOT NULL,
  arch TEXT NOT NULL, nvrtc_version TEXT NOT NULL, cubin BLOB NOT NULL, checksum TEXT NOT NULL,
  registers INTEGER NOT NULL, spill_bytes INTEGER NOT NULL, static_smem INTEGER NOT NULL,
  dynamic_smem INTEGER NOT NULL, threads INTEGER NOT NULL, log TEXT NOT NULL,
  created REAL NOT NULL, last_used REAL NOT NULL);
CREATE INDEX binaries_by_last_used ON binaries(last_used);
CREATE TABLE measurements(
  id INTEGER PRIMARY KEY, key_hash TEXT NOT NULL, key_text TEXT NOT NULL, family TEXT NOT NULL,
  template_hash TEXT NOT NULL, shape TEXT NOT NULL, token_bucket INTEGER NOT NULL,
  device TEXT NOT NULL, policy TEXT NOT NULL, config TEXT NOT NULL,
  status TEXT NOT NULL CHECK(status IN ('ok', 'illegal', 'compile_failed', 'run_failed', 'wrong_result')),
  median_ms REAL, spread_ms REAL, samples INTEGER NOT NULL, detail TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX measurements_by_key ON measurements(key_hash);
CREATE TABLE winners(
  key_hash TEXT PRIMARY KEY NOT NULL, key_text TEXT NOT NULL, family TEXT NOT NULL,
  template_hash TEXT NOT NULL, shape TEXT NOT NULL, token_bucket INTEGER NOT NULL,
  device TEXT NOT NULL, policy TEXT NOT NULL, config TEXT NOT NULL,
  median_ms REAL, spread_ms REAL, default_ms REAL, created REAL NOT NULL);
CREATE INDEX winners_by_shape ON winners(family, template_hash, shape, device);
)sql";

std::string os_reason(int err) { return std::strerror(err); }

// What kind of thing a stat() result is, for messages.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Creates the missing folders of `folder` one by one, each 0700: the cache holds code that
// runs on the GPU, so other users must not be able to plant files in it.
void create_private_folders(const fs::path& folder, const std::string& path) {
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path f = folder; !f.empty() && !fs::exists(f, ec); f = f.parent_path()) {
    missing.push_back(f);
    if (f == f.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it)
    if (::mkdir(it->c_str(), 0700) != 0 && errno != EEXIST)
      throw CacheError(fmt::format("cache {}: cannot create folder {}: {}", path, it->string(), os_reason(errno)));
}

// What the path allows, found before SQLite sees it: so that errors name the path and the
// OS's reason, so that a FIFO or a device never reaches open() (which would block), and so
// that a file this process cannot write is opened for reading instead of failing.
struct PathAccess {
  bool exists = false;
  std::string cannot_write;  // why the cache cannot be written (empty: it can)
};

PathAccess check_path(const std::string& path, bool read_only) {
  auto os_error = [&](const std::string& what, int err) {
    return CacheError(fmt::format("cache {}: {}: {}", path, what, os_reason(err)));
  };
  PathAccess a;
  struct stat st;
  // A symbolic link to nothing would be followed, and a file created where it points.
  if (struct stat link; ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode) && ::stat(path.c_str(), &st) != 0 &&
                        errno == ENOENT) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(path, ec);
    throw CacheError(fmt::format("cache {}: a symbolic link to {}, which does not exist: refused (it would be created "
                                 "there); give the target's path, or create the cache there first",
                                 path, ec ? std::string("a missing file") : target.string()));
  }
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw os_error("cannot use as a cache file", EISDIR);
    if (!S_ISREG(st.st_mode))
      throw CacheError(fmt::format("cache {}: cannot use as a cache file: it is {}, not a regular file", path,
                                   file_kind(st.st_mode)));
    a.exists = true;
    if (::access(path.c_str(), R_OK) != 0) throw os_error("cannot read", errno);
  } else if (errno != ENOENT) {
    throw os_error("cannot use as a cache file", errno);  // e.g. ENOTDIR: a file where a folder should be
  } else if (read_only) {
    throw os_error("cannot open read-only", ENOENT);
  }
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  std::error_code ec;
  if (!a.exists) {
    if (!fs::exists(folder, ec)) create_private_folders(folder, path);
    if (!fs::is_directory(folder, ec)) throw os_error(fmt::format("folder {}", folder.string()), ENOTDIR);
  }
  // WAL mode creates PATH-wal and PATH-shm beside the file: the folder must be writable too.
  // Known for read-only opens as well: checking a leftover -wal needs write access.
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    a.cannot_write = fmt::format("cannot write in folder {}: {}", folder.string(), os_reason(errno));
  else if (a.exists && ::access(path.c_str(), W_OK) != 0)
    a.cannot_write = fmt::format("cannot write the file: {}", os_reason(errno));
  if (!a.exists && !a.cannot_write.empty()) throw CacheError(fmt::format("cache {}: {}", path, a.cannot_write));
  return a;
}

// A new cache file, created before SQLite opens it so that it is private (0600); SQLite
// gives PATH-wal and PATH-shm the same mode.
void create_private_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd >= 0) ::close(fd);
  else if (errno != EEXIST)  // another process created it first: it is opened as found
    throw CacheError(fmt::format("cache {}: cannot create: {}", path, os_reason(errno)));
}

// Why an open file cannot serve as this build's cache. `damaged`: a moeblaze cache whose
// pages fail quick_check (salvageable); otherwise foreign, newer, or not a database at all.
struct Unusable {
  std::string reason;
  bool damaged = false;
  std::vector<std::string> problems;
  static Unusable refused(std::string why) { return Unusable{std::move(why), false, {}}; }
};

Unusable check_file(Connection& db) {
  try {
    // One read transaction: separate statements could see another process's schema
    // creation half way (application_id still 0 but tables already there).
    db.exec("BEGIN", "checking the file");
    struct EndRead {
      sqlite3* db;
      ~EndRead() { sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr); }
    } end_read{db.get()};
    const int64_t app = scalar(db, "PRAGMA application_id");
    const int64_t version = scalar(db, "PRAGMA user_version");
    const int64_t objects = scalar(db, "SELECT count(*) FROM sqlite_master");
    if (app != kApplicationId && !(app == 0 && objects == 0))  // an empty file is a fresh cache
      return Unusable::refused(fmt::format("not a moeblaze cache (application_id {:#x}); it is left as it is", app));
    if (version > kCacheSchemaVersion)
      return Unusable::refused(fmt::format("schema version {} is newer than this build's {}: a newer moeblaze wrote "
                                           "it; it is left as it is (use that moeblaze, or another cache file)",
                                           version, kCacheSchemaVersion));
    Unusable u;
    Statement check(db, "PRAGMA quick_check(20)", "checking the file");
    while (check.step())
      if (const std::string row = check.text(0); row != "ok") u.problems.push_back(row);
    if (!u.problems.empty()) {
      u.reason = "damaged (quick_check: " + u.problems[0] + (u.problems.size() > 1 ? ", ..." : "") + ")";
      u.damaged = true;
    }
    return u;
  } catch (const SqliteError& e) {
    if (e.code == SQLITE_NOTADB) return Unusable::refused("not an SQLite database; it is left as it is");
    if (e.code == SQLITE_CORRUPT) return Unusable{fmt::format("damaged ({})", sqlite3_errstr(e.code)), true, {sqlite3_errstr(e.code)}};
    throw;
  }
}

void set_checkpoint_on_close(Connection& db, bool on) {
  if (const int rc = sqlite3_db_config(db.get(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, on ? 0 : 1, nullptr); rc != SQLITE_OK)
    db.fail(rc, "setting checkpoint on close");
}

// WAL lets readers run beside the one writer. Switching needs a moment of exclusive access,
// which SQLite may refuse without waiting while other processes open the same new file.
void enable_wal(Connection& db, std::vector<std::string>& notices) {
  for (int attempt = 0;; ++attempt) {
    try {
      Statement s(db, "PRAGMA journal_mode=WAL", "switching to WAL");
      const std::string mode = s.step() ? s.text(0) : "";
      if (mode != "wal")  // e.g. a file system without shared memory: still correct, only slower
        notices.push_back(fmt::format("cache {}: WAL journal unavailable, using \"{}\"", db.path(), mode));
      return;
    } catch (const SqliteError& e) {
      if ((e.code != SQLITE_BUSY && e.code != SQLITE_LOCKED) || attempt >= 600) throw;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// A fresh random file id, 32 hex digits.
std::string new_file_id() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) id += fmt::format("{:08x}", uint32_t(rd()));
  return id;
}

// Gives the file a file id and write count where it has none (a file from before them) or,
// with fresh_id, a new id (a -wal taken on request may have brought another file's). Returns
// whether the table was added.
bool ensure_file_id(Connection& db, bool fresh_id) {
  const bool added = scalar(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'cache_file'") == 0;
  if (added) db.exec("CREATE TABLE cache_file(id TEXT NOT NULL, writes INTEGER NOT NULL)", "adding the file id");
  if (scalar(db, "SELECT count(*) FROM cache_file") == 0) {
    Statement s(db, "INSERT INTO cache_file(id, writes) VALUES(?, 0)", "adding the file id");
    s.bind_text(1, new_file_id()).step();
  } else if (fresh_id) {
    Statement s(db, "UPDATE cache_file SET id = ?", "renewing the file id");
    s.bind_text(1, new_file_id()).step();
  }
  return added;
}

// Brings the schema from the version found to kCacheSchemaVersion, one case per step, all
// in one transaction (another process may have migrated meanwhile: the version is read
// under the write lock). A v2 turns `case 1` into its v1 -> v2 step and adds `case 2`.
void migrate(Connection& db, bool fresh_id) {
  static_assert(kCacheSchemaVersion == 1, "add the step from the previous version to migrate()");
  WriteTransaction tx(db);
  const int64_t found = scalar(db, "PRAGMA user_version");
  switch (found) {
    case 0:
      db.exec(kSchemaV1, "creating the cache tables");
      [[fallthrough]];
    case 1:
      break;
    default:
      throw CacheError(fmt::format("cache {}: schema version {} is newer than this build's {}", db.path(), found,
                                   kCacheSchemaVersion));
  }
  if (found != kCacheSchemaVersion)
    db.exec(fmt::format("PRAGMA application_id = {}; PRAGMA user_version = {};", kApplicationId, kCacheSchemaVersion),
            "setting the schema version");
  const bool added = ensure_file_id(db, fresh_id);
  tx.commit();
  // Until the id is in the file itself (not only in the -wal), a crash would leave a -wal
  // that cannot be told to be this file's: copy it in now (best effort; readers may hold it).
  if (added && found != 0) sqlite3_wal_checkpoint_v2(db.get(), nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
}

// TuningKey columns in table order: family, template_hash, shape, token_bucket, device, policy.
void bind_key(Statement& s, int first, const TuningKey& k) {
  s.bind_text(first, k.family).bind_text(first + 1, k.template_hash).bind_text(first + 2, k.shape);
  s.bind_int(first + 3, k.token_bucket).bind_text(first + 4, k.device).bind_text(first + 5, k.policy);
}
TuningKey read_key(const Statement& s, int first) {
  TuningKey k;
  k.family = s.text(first);
  k.template_hash = s.text(first + 1);
  k.shape = s.text(first + 2);
  k.token_bucket = s.integer(first + 3);
  k.device = s.text(first + 4);
  k.policy = s.text(first + 5);
  return k;
}

constexpr const char* kWinnerSelect =
    "SELECT family, template_hash, shape, token_bucket, device, policy, config, median_ms, spread_ms, default_ms, "
    "created FROM winners ";
Winner read_winner(const Statement& s) {
  Winner w;
  w.key = read_key(s, 0);
  w.config = s.text(6);
  w.median_ms = s.real(7);
  w.spread_ms = s.real(8);
  w.default_ms = s.real(9);
  w.created = s.real(10);
  return w;
}
std::vector<Winner> read_winners(Statement& s) {
  std::vector<Winner> out;
  while (s.step()) out.push_back(read_winner(s));
  return out;
}

// A field escaped for TuningKey::text(): ';' separates fields and policies contain ';'.
std::string escape_field(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == ';' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

namespace cache_detail {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string checksum(const std::vector<char>& blob) {
  return fmt::format("{:016x}", fnv1a64(std::string_view(blob.data(), blob.size())));
}

std::string file_uri(const std::string& path, const char* query) {
  std::string uri = "file:";
  for (unsigned char c : fs::absolute(path).lexically_normal().string()) {
    if (std::isalnum(c) || (c != 0 && std::strchr("/._-~", c))) uri += char(c);
    else uri += fmt::format("%{:02X}", c);
  }
  return uri + query;
}

}  // namespace cache_detail

std::string key_hash(const std::string& text) { return fmt::format("{:016x}", fnv1a64(text)); }

std::string TuningKey::text() const {
  return fmt::format("family={};template={};shape={};bucket={};device={};policy={}", escape_field(family),
                     escape_field(template_hash), escape_field(shape), token_bucket, escape_field(device),
                     escape_field(policy));
}
std::string TuningKey::hash() const { return key_hash(text()); }

void KernelCache::Impl::open() {
  const PathAccess access = check_path(path, read_only);
  const bool fell_back = !read_only && !access.cannot_write.empty();
  if (fell_back) {
    read_only = true;
    notices.push_back(fmt::format("cache {} is read-only ({}): reading it, nothing will be stored", path,
                                  access.cannot_write));
  }
  if (!access.exists) create_private_file(path);
  // Before SQLite sees the file: it would fold in whatever -wal lies beside it.
  if (access.exists && access.cannot_write.empty() && !take_wal) check_leftover_wal(path);
  auto attempt = [&](OpenAs as) {
    db = std::make_unique<Connection>(path, as);
    // Until the file is known good, closing must not checkpoint a -wal into it (nor delete
    // the -wal and -shm): a refused file stays exactly as it was found.
    set_checkpoint_on_close(*db, false);
    return check_file(*db);
  };
  Unusable u;
  std::error_code ec;
  const bool has_wal = fs::exists(path + "-wal", ec), has_shm = fs::exists(path + "-shm", ec);
  struct stat st;
  const bool owned = ::stat(path.c_str(), &st) == 0 && st.st_uid == ::geteuid();
  if (!read_only) {
    u = attempt(OpenAs::read_write);
  } else if (!owned && !(has_wal && has_shm)) {
    // Reading a WAL file normally creates PATH-wal and PATH-shm, owned by the reader: the
    // owner could then no longer write its cache (nor, in a sticky folder, delete them). A
    // reader that does not own the file reads it without locks and leaves nothing behind.
    u = attempt(OpenAs::immutable);
    const auto wal = has_wal ? fs::file_size(path + "-wal", ec) : 0;
    notices.push_back(fmt::format("cache {}: read without locks (another user's file: nothing is created beside "
                                  "it){}",
                                  path, !ec && wal > 0 ? fmt::format("; the {} bytes of {}-wal are not read", wal, path) : ""));
  } else {
    try {
      u = attempt(OpenAs::read_only);
    } catch (const SqliteError& e) {
      // A WAL file in a folder this process cannot write: SQLite cannot create the -shm it
      // needs to read, so read the file as it is, without locks.
      if (e.code != SQLITE_CANTOPEN && e.code != SQLITE_READONLY && e.code != SQLITE_IOERR) throw;
      db.reset();
      u = attempt(OpenAs::immutable);
      const auto wal = fs::file_size(path + "-wal", ec);
      notices.push_back(fmt::format("cache {}: opened without locks (its folder is read-only){}", path,
                                    !ec && wal > 0 ? fmt::format("; the {} bytes of {}-wal are not read", wal, path) : ""));
    }
  }
  if (!u.reason.empty()) {
    db.reset();
    if (u.damaged)
      throw CacheDamaged(fmt::format("cache {} is {}; nothing was changed. `moeblaze cache verify --db {}` lists the "
                                     "damage; `moeblaze cache verify --fix --db {}` copies every readable row into a "
                                     "fresh file and keeps the damaged one beside it",
                                     path, u.reason, path, path),
                         u.problems);
    throw CacheError(fmt::format("cache {}: {}", path, u.reason));
  }
  set_checkpoint_on_close(*db, true);
  if (read_only) {  // no migration without write access
    if (const int64_t v = scalar(*db, "PRAGMA user_version"); v != kCacheSchemaVersion)
      throw CacheError(fmt::format("cache {}: schema version {}, this build needs {}; it cannot be set up read-only{}",
                                   path, v, kCacheSchemaVersion,
                                   fell_back ? " (" + access.cannot_write + ")" : ""));
    return;
  }
  enable_wal(*db, notices);
  db->exec("PRAGMA synchronous = NORMAL", "setting synchronous");  // safe with WAL: a crash loses no committed file
  migrate(*db, take_wal);
}

// Records a use for gc's oldest-first order. Best effort: a busy or read-only file only
// loses the hint, so it waits briefly and ignores those.
void KernelCache::Impl::touch(const std::string& hash) {
  if (read_only) return;
  struct RestoreTimeout {
    sqlite3* db;
    ~RestoreTimeout() { sqlite3_busy_timeout(db, kBusyTimeoutMs); }
  } restore{db->get()};
  sqlite3_busy_timeout(db->get(), kTouchTimeoutMs);
  try {
    WriteTransaction tx(*db);
    Statement s(*db, "UPDATE binaries SET last_used = ? WHERE key_hash = ?", "recording a use");
    s.bind_real(1, unix_now()).bind_text(2, hash).step();
    tx.commit();
  } catch (const SqliteError& e) {
    if (e.code != SQLITE_BUSY && e.code != SQLITE_LOCKED && e.code != SQLITE_READONLY) throw;
  }
}

// Deletes exactly the row that failed (matching its blob, so that a good copy another
// process stored meanwhile stays) and says so.
void KernelCache::Impl::drop_bad_binary(const std::string& hash, const std::string& name, const std::vector<char>& cubin) {
  if (read_only) {
    notices.push_back(fmt::format("cache {}: binary {} ({}) failed its checksum; left in place (read-only)", path, hash, name));
    return;
  }
  write("delete a binary that failed its checksum", [&] {
    Statement s(*db, "DELETE FROM binaries WHERE key_hash = ? AND CAST(cubin AS BLOB) = ?", "deleting a bad binary");
    s.bind_text(1, hash).bind_blob(2, cubin).step();
  });
  notices.push_back(fmt::format("cache {}: binary {} ({}) failed its checksum; deleted, it will be rebuilt", path, hash, name));
}

std::string KernelCache::default_path() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (std::string p = env("MOEBLAZE_CACHE"); !p.empty()) return p;
  if (std::string p = env("XDG_CACHE_HOME"); !p.empty()) return p + "/moeblaze/kernels.db";
  if (std::string p = env("HOME"); !p.empty()) return p + "/.cache/moeblaze/kernels.db";
  throw CacheError("cache: no default path: set MOEBLAZE_CACHE, XDG_CACHE_HOME or HOME");
}

KernelCache::KernelCache(const std::string& path, bool read_only, bool take_wal) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->read_only = read_only;
  impl->take_wal = take_wal;
  impl->open();
  impl_ = impl.release();
}

KernelCache::~KernelCache() { delete impl_; }

const std::string& KernelCache::path() const { return impl_->path; }
bool KernelCache::writable() const { return !impl_->read_only; }
const std::vector<std::string>& KernelCache::notices() const { return impl_->notices; }

std::optional<CachedBinary> KernelCache::find_binary(const std::string& hash, const std::string& key) {
  CachedBinary b;
  std::string stored_checksum;
  {  // the read statement ends before any write below
    Statement s(*impl_->db,
                "SELECT key, kernel_name, arch, nvrtc_version, cubin, checksum, registers, spill_bytes, static_smem, "
                "dynamic_smem, threads, log FROM binaries WHERE key_hash = ?",
                "looking up a binary");
    s.bind_text(1, hash);
    if (!s.step() || s.text(0) != key) return std::nullopt;  // a hash hit with another key is a miss
    b.key_hash = hash;
    b.key = key;
    b.kernel_name = s.text(1);
    b.arch = s.text(2);
    b.nvrtc_version = s.text(3);
    b.cubin = s.blob(4);
    stored_checksum = s.text(5);
    b.registers = int(s.integer(6));
    b.spill_bytes = int(s.integer(7));
    b.static_smem = int(s.integer(8));
    b.dynamic_smem = int(s.integer(9));
    b.threads = int(s.integer(10));
    b.log = s.text(11);
  }
  if (checksum(b.cubin) != stored_checksum) {
    impl_->drop_bad_binary(hash, b.kernel_name, b.cubin);
    return std::nullopt;
  }
  impl_->touch(hash);
  return b;
}

void KernelCache::put_binary(const CachedBinary& b) {
  impl_->write("store a binary", [&] {
    Statement s(*impl_->db, fmt::format("INSERT OR REPLACE INTO binaries({}) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", kBinaryColumns),
                "storing binary " + b.key_hash);
    const double now = unix_now();
    s.bind_text(1, b.key_hash).bind_text(2, b.key).bind_text(3, b.kernel_name).bind_text(4, b.arch);
    s.bind_text(5, b.nvrtc_version).bind_blob(6, b.cubin).bind_text(7, checksum(b.cubin));
    s.bind_int(8, b.registers).bind_int(9, b.spill_bytes).bind_int(10, b.static_smem);
    s.bind_int(11, b.dynamic_smem).bind_int(12, b.threads).bind_text(13, b.log).bind_real(14, now).bind_real(15, now);
    s.step();
  });
}

void KernelCache::add_measurements(const std::vector<Measurement>& ms) {
  impl_->write("store measurements", [&] {
    Statement s(*impl_->db, fmt::format("INSERT INTO measurements({}) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", kMeasurementColumns),
                "storing a measurement");
    const double now = unix_now();
    for (const Measurement& m : ms) {
      s.reset();
      s.bind_text(1, m.key.hash()).bind_text(2, m.key.text());
      bind_key(s, 3, m.key);
      s.bind_text(9, m.config).bind_text(10, m.status).bind_real(11, m.median_ms).bind_real(12, m.spread_ms);
      s.bind_int(13, m.samples).bind_text(14, m.detail).bind_real(15, now);
      s.step();
    }
  });
}

std::vector<Measurement> KernelCache::measurements(const std::string& tuning_key_hash) {
  Statement s(*impl_->db,
              "SELECT family, template_hash, shape, token_bucket, device, policy, config, status, median_ms, spread_ms, "
              "samples, detail, created FROM measurements WHERE key_hash = ? ORDER BY id",
              "reading measurements");
  s.bind_text(1, tuning_key_hash);
  std::vector<Measurement> out;
  while (s.step()) {
    Measurement m;
    m.key = read_key(s, 0);
    m.config = s.text(6);
    m.status = s.text(7);
    m.median_ms = s.real(8);
    m.spread_ms = s.real(9);
    m.samples = int(s.integer(10));
    m.detail = s.text(11);
    m.created = s.real(12);
    out.push_back(std::move(m));
  }
  return out;
}

void KernelCache::put_winner(const Winner& w) {
  impl_->write("store a winner", [&] {
    Statement s(*impl_->db, fmt::format("INSERT OR REPLACE INTO winners({}) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)", kWinnerColumns),
                "storing a winner");
    s.bind_text(1, w.key.hash()).bind_text(2, w.key.text());
    bind_key(s, 3, w.key);
    s.bind_text(9, w.config).bind_real(10, w.median_ms).bind_real(11, w.spread_ms).bind_real(12, w.default_ms);
    s.bind_real(13, unix_now());
    s.step();
  });
}

std::optional<Winner> KernelCache::find_winner(const TuningKey& key) {
  Statement s(*impl_->db, std::string(kWinnerSelect) + "WHERE key_hash = ? AND key_text = ?", "looking up a winner");
  s.bind_text(1, key.hash()).bind_text(2, key.text());
  if (!s.step()) return std::nullopt;
  return read_winner(s);
}

std::vector<Winner> KernelCache::winners_for(const std::string& family, const std::string& template_hash,
                                             const std::string& shape, const std::string& device) {
  Statement s(*impl_->db,
              std::string(kWinnerSelect) +
                  "WHERE family = ? AND template_hash = ? AND shape = ? AND device = ? ORDER BY token_bucket, policy",
              "looking up winners");
  s.bind_text(1, family).bind_text(2, template_hash).bind_text(3, shape).bind_text(4, device);
  return read_winners(s);
}

std::vector<Winner> KernelCache::all_winners() {
  Statement s(*impl_->db, std::string(kWinnerSelect) + "ORDER BY family, shape, device, token_bucket, policy",
              "reading winners");
  return read_winners(s);
}

}  // namespace moeblaze
