// Internals shared by kernel_cache.cpp (open, binaries, tuning results) and
// kernel_cache_admin.cpp (summary, export, import, verify, gc): RAII for sqlite3* and
// sqlite3_stmt*, the write transaction, and KernelCache::Impl. Not part of the public API.
#pragma once
#include <fmt/format.h>
#include <sqlite3.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"

namespace moeblaze {
namespace cache_detail {

inline constexpr int32_t kApplicationId = 0x4D4F4542;  // 'MOEB' in the file header: a moeblaze cache
inline constexpr int kBusyTimeoutMs = 30000;           // other processes' short writes wait, never fail
inline constexpr int kTouchTimeoutMs = 250;            // last_used is a hint for gc: never wait long for it

// The columns every insert and import names explicitly (measurements without their id), so
// a later schema that adds a column cannot shift values.
inline constexpr const char* kBinaryColumns =
    "key_hash, key, kernel_name, arch, nvrtc_version, cubin, checksum, registers, spill_bytes, "
    "static_smem, dynamic_smem, threads, log, created, last_used";
inline constexpr const char* kMeasurementColumns =
    "key_hash, key_text, family, template_hash, shape, token_bucket, device, policy, config, status, "
    "median_ms, spread_ms, samples, detail, created";
inline constexpr const char* kWinnerColumns =
    "key_hash, key_text, family, template_hash, shape, token_bucket, device, policy, config, median_ms, "
    "spread_ms, default_ms, created";

// A CacheError that keeps the SQLite result code (primary and extended), so that callers can
// tell a damaged file from a locked or unreadable one.
struct SqliteError : CacheError {
  int code, extended_code;
  SqliteError(std::string m, int c) : CacheError(std::move(m)), code(c & 0xff), extended_code(c) {}
};

double unix_now();
// FNV-1a 64 of the blob bytes, as 16 hex digits (the same hash as key_hash()).
std::string checksum(const std::vector<char>& blob);
// A file: URI for a path. The connection is opened with SQLITE_OPEN_URI so that ATTACH can
// ask for mode=ro; encoding every path this way keeps names like "file:x" or "a?b" literal.
std::string file_uri(const std::string& path, const char* query = "");

// How a connection opens its file.
enum class OpenAs {
  read_write,  // creates the file if missing
  read_only,
  immutable,   // read-only, no locks and no -wal/-shm: for files in folders this process cannot write
  untrusted,   // read-only and defensive, for files from elsewhere (import): trusted_schema off, no views,
               // no triggers, SQLite's defensive mode, cell size checks
  untrusted_immutable,  // the same, without locks (an untrusted file in a folder this process cannot write)
};

// An open sqlite3* and the path it names in error messages.
class Connection {
 public:
  Connection(const std::string& path, OpenAs as) : path_(path) {
    const bool writes = as == OpenAs::read_write;
    const int flags = SQLITE_OPEN_URI | (writes ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY);
    untrusted_ = as == OpenAs::untrusted || as == OpenAs::untrusted_immutable;
    const bool untrusted = untrusted_;
    const char* query = as == OpenAs::immutable || as == OpenAs::untrusted_immutable ? "?immutable=1"
                        : writes                                                   ? ""
                                                                                   : "?mode=ro";
    const int rc = sqlite3_open_v2(file_uri(path, query).c_str(), &db_, flags, nullptr);
    if (rc != SQLITE_OK) {
      const std::string why = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
      sqlite3_close_v2(db_);
      throw SqliteError(fmt::format("cache {}: cannot open: {}", path, why), rc);
    }
    sqlite3_busy_timeout(db_, kBusyTimeoutMs);
    sqlite3_extended_result_codes(db_, 1);
    if (untrusted) harden();
  }
  ~Connection() { sqlite3_close_v2(db_); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  sqlite3* get() const { return db_; }
  const std::string& path() const { return path_; }

  // A damaged cache gets the command that salvages it named in the message (a file being
  // imported is not a cache of the user's: no such advice).
  [[noreturn]] void fail(int rc, const std::string& what) const {
    const int primary = rc & 0xff;
    const bool damaged = !untrusted_ && (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB);
    throw SqliteError(fmt::format("cache {}: {}: {}{}", path_, what, sqlite3_errmsg(db_),
                                  damaged ? fmt::format(" (the file is left as it is; `moeblaze cache verify --db {}` "
                                                        "reports the damage and `--fix` salvages its readable rows)",
                                                        path_)
                                          : ""),
                      rc);
  }
  void exec(const std::string& sql, const std::string& what) {
    if (const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr); rc != SQLITE_OK) fail(rc, what);
  }

 private:
  // Before the schema is read: nothing in the file may run code or change anything.
  void harden() {
    for (auto [option, value] : {std::pair{SQLITE_DBCONFIG_DEFENSIVE, 1}, std::pair{SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0},
                                 std::pair{SQLITE_DBCONFIG_ENABLE_VIEW, 0}, std::pair{SQLITE_DBCONFIG_ENABLE_TRIGGER, 0}})
      if (const int rc = sqlite3_db_config(db_, option, value, nullptr); rc != SQLITE_OK)
        fail(rc, "opening defensively");
    sqlite3_limit(db_, SQLITE_LIMIT_ATTACHED, 0);
    exec("PRAGMA cell_size_check = ON", "opening defensively");
  }

  std::string path_;
  sqlite3* db_ = nullptr;
  bool untrusted_ = false;
};

// A prepared statement; `what` says in errors what it was doing ("storing a binary").
class Statement {
 public:
  Statement(Connection& c, const std::string& sql, std::string what) : c_(c), what_(std::move(what)) {
    if (const int rc = sqlite3_prepare_v2(c.get(), sql.c_str(), -1, &s_, nullptr); rc != SQLITE_OK) c.fail(rc, what_);
  }
  ~Statement() { sqlite3_finalize(s_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind_text(int i, const std::string& v) {
    return check(sqlite3_bind_text(s_, i, v.data(), int(v.size()), SQLITE_TRANSIENT));
  }
  Statement& bind_int(int i, int64_t v) { return check(sqlite3_bind_int64(s_, i, v)); }
  Statement& bind_real(int i, double v) { return check(sqlite3_bind_double(s_, i, v)); }
  Statement& bind_null(int i) { return check(sqlite3_bind_null(s_, i)); }
  Statement& bind_blob_bytes(int i, const std::string& v) {
    static const char empty = 0;
    return check(sqlite3_bind_blob(s_, i, v.empty() ? &empty : v.data(), int(v.size()), SQLITE_TRANSIENT));
  }
  Statement& bind_blob(int i, const std::vector<char>& v) {
    // A null pointer would bind NULL; an empty binary is an empty blob.
    static const char empty = 0;
    return check(sqlite3_bind_blob(s_, i, v.empty() ? &empty : v.data(), int(v.size()), SQLITE_TRANSIENT));
  }

  // True while there is a row; false when done; throws on any other result.
  bool step() {
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    c_.fail(rc, what_);
  }
  // Runs a statement again with new bindings (one insert per row of a batch).
  void reset() {
    sqlite3_reset(s_);  // its code repeats the last step's, which already threw if bad
    check(sqlite3_clear_bindings(s_));
  }

  std::string text(int col) const {
    const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(s_, col));
    return t ? std::string(t, size_t(sqlite3_column_bytes(s_, col))) : std::string();
  }
  int64_t integer(int col) const { return sqlite3_column_int64(s_, col); }
  double real(int col) const {
    return sqlite3_column_type(s_, col) == SQLITE_NULL ? std::numeric_limits<double>::quiet_NaN()
                                                       : sqlite3_column_double(s_, col);
  }
  std::vector<char> blob(int col) const {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(s_, col));
    return p ? std::vector<char>(p, p + sqlite3_column_bytes(s_, col)) : std::vector<char>();
  }

 private:
  Statement& check(int rc) {
    if (rc != SQLITE_OK) c_.fail(rc, what_);
    return *this;
  }
  Connection& c_;
  std::string what_;
  sqlite3_stmt* s_ = nullptr;
};

// BEGIN IMMEDIATE takes the write lock up front (waiting through busy_timeout), so a write
// never fails half-way for lack of it; the destructor rolls back anything not committed.
// Every commit counts a write in cache_file, so that each transaction in a -wal carries the
// file's id (kernel_cache_wal.cpp: whose -wal it is).
class WriteTransaction {
 public:
  explicit WriteTransaction(Connection& c) : c_(c) { c_.exec("BEGIN IMMEDIATE", "starting a write transaction"); }
  ~WriteTransaction() {
    if (!sqlite3_get_autocommit(c_.get())) sqlite3_exec(c_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
  }
  WriteTransaction(const WriteTransaction&) = delete;
  WriteTransaction& operator=(const WriteTransaction&) = delete;
  void commit() {
    c_.exec("UPDATE cache_file SET writes = writes + 1", "counting a write");
    c_.exec("COMMIT", "committing");
  }

 private:
  Connection& c_;
};

// The first column of the first row of `sql` (0 when there is none).
inline int64_t scalar(Connection& c, const std::string& sql) {
  Statement s(c, sql, sql);
  return s.step() ? s.integer(0) : 0;
}

// Refuses (CacheWalRefused) a PATH-wal that no process has open and that is not the cache's
// own; returns at once when there is none or it is live (kernel_cache_wal.cpp).
void check_leftover_wal(const std::string& path);

}  // namespace cache_detail

struct KernelCache::Impl {
  std::string path;
  bool read_only = false;
  bool take_wal = false;  // fold in a leftover -wal unchecked: the caller asked for it
  std::vector<std::string> notices;
  std::unique_ptr<cache_detail::Connection> db;

  // Checks the path, opens (falling back to reading when the file cannot be written), refuses
  // an unusable file without touching it, migrates.
  void open();

  void require_writable(const std::string& what) const {
    if (read_only) throw CacheError(fmt::format("cache {} is open read-only: cannot {}", path, what));
  }
  // One public write: one transaction, rolled back when `body` throws.
  template <class F>
  void write(const std::string& what, F&& body) {
    require_writable(what);
    cache_detail::WriteTransaction tx(*db);
    body();
    tx.commit();
  }

  // Records a use for gc's least-recently-used order (best effort).
  void touch(const std::string& hash);
  // Deletes the binary row that failed its checksum and adds a notice.
  void drop_bad_binary(const std::string& hash, const std::string& name, const std::vector<char>& cubin);
  // Copies the rows of `src` (an export, or a damaged cache when tolerate_damage) that pass
  // every check into this cache, in short transactions, leaving out rows it already has.
  ImportReport copy_rows(cache_detail::Connection& src, const TuningRowCheck& check, const ImportLimits& limits,
                         bool tolerate_damage);
};

}  // namespace moeblaze
