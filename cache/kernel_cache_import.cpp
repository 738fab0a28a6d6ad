// KernelCache import (rows of an exported file) and salvage (rows of a damaged cache): both
// read a file that is not trusted, check every row, and write the good ones in short
// transactions without duplicating what the cache already holds.
#include <fcntl.h>
#include <fmt/format.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>

#include "cache/kernel_cache_rows.hpp"
#include "cache/kernel_cache_sqlite.hpp"

namespace moeblaze {
namespace fs = std::filesystem;
using namespace cache_detail;

namespace {

// Rows and blob bytes per write transaction: long enough to be quick, short enough that
// another process's write never waits long.
constexpr int64_t kRowsPerTransaction = 512;
constexpr int64_t kBytesPerTransaction = int64_t{128} << 20;

// Inserts that leave out rows the cache already has (the natural key of each table):
// binaries by key hash; winners by key hash, where the newer measurement wins; measurements
// by their tuning key, tile, status, time, result and sample count (re-importing a file, or a
// file holding some of the cache's own rows, adds nothing twice).
std::string insert_sql(CacheTable t) {
  switch (t) {
    case CacheTable::binaries:
      return fmt::format("INSERT INTO main.binaries({}) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15) "
                         "ON CONFLICT(key_hash) DO NOTHING",
                         kBinaryColumns);
    case CacheTable::measurements:
      return fmt::format("INSERT INTO main.measurements({}) SELECT ?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15 "
                         "WHERE NOT EXISTS(SELECT 1 FROM main.measurements WHERE key_hash = ?1 AND config = ?9 AND "
                         "status = ?10 AND created = ?15 AND median_ms IS ?11 AND samples = ?13)",
                         kMeasurementColumns);
    case CacheTable::winners:
      return fmt::format("INSERT INTO main.winners({}) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13) "
                         "ON CONFLICT(key_hash) DO UPDATE SET key_text = excluded.key_text, family = excluded.family, "
                         "template_hash = excluded.template_hash, shape = excluded.shape, token_bucket = "
                         "excluded.token_bucket, device = excluded.device, policy = excluded.policy, config = "
                         "excluded.config, median_ms = excluded.median_ms, spread_ms = excluded.spread_ms, default_ms = "
                         "excluded.default_ms, created = excluded.created WHERE excluded.created > winners.created",
                         kWinnerColumns);
  }
  return "";
}

void bind_row(Statement& s, const Row& row) {
  for (size_t i = 0; i < row.size(); ++i) {
    const int at = int(i) + 1;
    const Value& v = row[i];
    switch (v.type) {
      case SQLITE_INTEGER: s.bind_int(at, v.integer); break;
      case SQLITE_FLOAT: s.bind_real(at, v.real); break;
      case SQLITE_TEXT: s.bind_text(at, v.bytes); break;
      case SQLITE_BLOB: s.bind_blob_bytes(at, v.bytes); break;
      default: s.bind_null(at); break;
    }
  }
}

int64_t row_bytes(const Row& row) {
  int64_t n = 0;
  for (const Value& v : row) n += int64_t(v.bytes.size()) + 8;
  return n;
}

// A read-only connection to a file from elsewhere that lets it run nothing. A WAL file in a
// folder this process cannot write cannot get its -shm: then it is read without locks.
std::unique_ptr<Connection> open_untrusted(const std::string& file) {
  try {
    auto c = std::make_unique<Connection>(file, OpenAs::untrusted);
    scalar(*c, "SELECT count(*) FROM sqlite_master");  // the first read opens the WAL, if any
    return c;
  } catch (const SqliteError& e) {
    if (e.code != SQLITE_CANTOPEN && e.code != SQLITE_READONLY) throw;
  }
  auto c = std::make_unique<Connection>(file, OpenAs::untrusted_immutable);
  return c;
}

std::vector<std::string> quick_check(Connection& c) {
  std::vector<std::string> problems;
  try {
    Statement s(c, "PRAGMA quick_check(20)", "checking the file");
    while (s.step())
      if (const std::string row = s.text(0); row != "ok") problems.push_back(row);
  } catch (const SqliteError& e) {
    problems.push_back(e.what());
  }
  return problems;
}

// stat() without following a FIFO into open(): a FIFO, device or folder is refused by kind.
std::string not_regular_file(const std::string& file, int64_t* size) {
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) return std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "not a regular file";
  if (::access(file.c_str(), R_OK) != 0) return fmt::format("cannot read: {}", std::strerror(errno));
  if (size) *size = int64_t(st.st_size);
  return "";
}

// A name beside `path` that no file has yet: PATH.<what>-<unix time>[-N].
std::string unused_name(const std::string& path, const char* what) {
  const long long now = static_cast<long long>(std::time(nullptr));
  std::string name = fmt::format("{}.{}-{}", path, what, now);
  std::error_code ec;
  for (int i = 1; fs::exists(name, ec) || fs::exists(name + "-wal", ec); ++i) name = fmt::format("{}.{}-{}-{}", path, what, now, i);
  return name;
}

uint32_t big_endian_u32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

int64_t ImportReport::skipped_rows() const {
  int64_t n = 0;
  for (const auto& [reason, count] : skipped) n += count;
  return n;
}

ImportReport KernelCache::Impl::copy_rows(Connection& src, const TuningRowCheck& check, const ImportLimits& limits,
                                          bool tolerate_damage) {
  require_writable("import rows");
  ImportReport r;
  std::unique_ptr<WriteTransaction> tx;
  int64_t rows_in_tx = 0, bytes_in_tx = 0;
  auto commit = [&] {
    if (tx) tx->commit();
    tx.reset();
    rows_in_tx = bytes_in_tx = 0;
  };
  for (CacheTable t : {CacheTable::binaries, CacheTable::measurements, CacheTable::winners}) {
    TableCopy& copy = t == CacheTable::binaries ? r.binaries : t == CacheTable::measurements ? r.measurements : r.winners;
    const std::string name = table_name(t);
    if (tolerate_damage)
      if (std::string why = source_table_problem(src, t); !why.empty()) {
        r.notes.push_back(fmt::format("table {} could not be read ({}): none of its rows were saved", name, why));
        continue;
      }
    Statement insert(*db, insert_sql(t), "importing into table " + name);
    RowWalker walker(src, t, tolerate_damage,
                     std::max(limits.max_blob_bytes, std::max(limits.max_text_bytes, limits.max_log_bytes)));
    Row row;
    try {
      for (RowWalker::Step step; (step = walker.next(row)) != RowWalker::Step::end;) {
        if (step == RowWalker::Step::skipped) continue;
        ++copy.read;
        if (copy.read > limits.max_rows) {
          ++r.skipped[fmt::format("{}: over the limit of {} rows", name, limits.max_rows)];
          continue;
        }
        if (std::string why = row_problem(t, row, check, limits); !why.empty()) {
          ++r.skipped[name + "." + why];
          continue;
        }
        if (!tx) tx = std::make_unique<WriteTransaction>(*db);
        insert.reset();
        bind_row(insert, row);
        insert.step();
        ++(sqlite3_changes64(db->get()) > 0 ? copy.taken : copy.duplicates);
        bytes_in_tx += row_bytes(row);
        if (++rows_in_tx >= kRowsPerTransaction || bytes_in_tx >= kBytesPerTransaction) commit();
      }
    } catch (...) {
      tx.reset();  // rolls back the open batch; committed batches hold only checked rows
      throw;
    }
    copy.unreadable = walker.unreadable();
    copy.damaged_ranges = walker.damaged_ranges();
    if (walker.too_big()) r.skipped[name + ": a value over the byte limit"] += walker.too_big();
  }
  commit();
  return r;
}

ImportReport KernelCache::import_from(const std::string& file, const TuningRowCheck& check, const ImportLimits& limits) {
  impl_->require_writable("import " + file);
  auto reject = [&](const std::string& why) {
    return CacheError(fmt::format("cache {}: {} is not a moeblaze cache export ({}); nothing was imported", impl_->path,
                                  file, why));
  };
  int64_t size = 0;
  if (std::string why = not_regular_file(file, &size); !why.empty()) throw reject(why);
  if (size > limits.max_file_bytes)
    throw reject(fmt::format("{} bytes, over the import limit of {}", size, limits.max_file_bytes));
  std::unique_ptr<Connection> src;
  try {
    src = open_untrusted(file);
    if (const int64_t app = scalar(*src, "PRAGMA application_id"); app != kApplicationId)
      throw reject(fmt::format("application_id {:#x}", app));
    if (const int64_t v = scalar(*src, "PRAGMA user_version"); v != kCacheSchemaVersion)
      throw reject(fmt::format("schema version {}, this build reads {}", v, kCacheSchemaVersion));
    if (const auto problems = quick_check(*src); !problems.empty())
      throw reject(fmt::format("damaged: quick_check: {}", problems[0]));
    for (CacheTable t : {CacheTable::binaries, CacheTable::measurements, CacheTable::winners})
      if (std::string why = source_table_problem(*src, t); !why.empty()) throw reject(why);
  } catch (const SqliteError& e) {
    throw reject(e.what());
  }
  return impl_->copy_rows(*src, check, limits, false);
}

SalvageReport KernelCache::salvage(const std::string& path, const TuningRowCheck& check) {
  auto refuse = [&](const std::string& why) {
    return CacheError(fmt::format("cache {}: {}; nothing was changed", path, why));
  };
  if (std::string why = not_regular_file(path, nullptr); !why.empty()) throw refuse("cannot salvage: " + why);
  {
    // The header alone says whose file it is, even when the pages after it are damaged.
    unsigned char header[100] = {};
    std::ifstream f(path, std::ios::binary);
    f.read(reinterpret_cast<char*>(header), sizeof header);
    if (f.gcount() != sizeof header || std::memcmp(header, "SQLite format 3", 16) != 0)
      throw refuse("not an SQLite database (no SQLite header), so there are no rows to salvage; move it away yourself "
                   "to start a fresh cache");
    if (const uint32_t app = big_endian_u32(header + 68); app != uint32_t(kApplicationId))
      throw refuse(fmt::format("not a moeblaze cache (application_id {:#x}): `verify --fix` repairs moeblaze caches only", app));
    if (const uint32_t v = big_endian_u32(header + 60); v > uint32_t(kCacheSchemaVersion))
      throw refuse(fmt::format("schema version {} is newer than this build's {}: salvage it with the moeblaze that wrote it",
                               v, kCacheSchemaVersion));
  }
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    throw refuse(fmt::format("cannot write in folder {}: {}", folder.string(), std::strerror(errno)));

  SalvageReport out;
  std::unique_ptr<Connection> src = open_untrusted(path);
  out.problems = quick_check(*src);
  const std::string fresh = unused_name(path, "salvage");
  try {
    KernelCache dst(fresh);
    ImportLimits own;  // the user's own rows: no caps on counts
    own.max_rows = std::numeric_limits<int64_t>::max();
    out.copied = dst.impl_->copy_rows(*src, check, own, true);
  } catch (...) {
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(fresh + suffix, ec);
    throw;
  }
  src.reset();
  // The salvaged file takes the original's owner, group and mode: root salvaging a user's
  // cache must not leave the user a file only root can read.
  struct stat original;
  if (::stat(path.c_str(), &original) == 0) {
    const bool owned = ::chown(fresh.c_str(), original.st_uid, original.st_gid) == 0;
    if (!owned || ::chmod(fresh.c_str(), original.st_mode & 07777) != 0) {
      const std::string why = std::strerror(errno);
      std::error_code ec;
      fs::remove(fresh, ec);
      throw refuse(fmt::format("cannot give the salvaged file the owner and mode of the original ({}: {})",
                               owned ? "chmod" : "chown", why));
    }
  }
  // The original keeps its -wal and -shm beside it (a -wal must never meet another file),
  // then the fresh file takes its place.
  out.damaged_copy = unused_name(path, "damaged");
  std::error_code ec;
  for (const char* suffix : {"-wal", "-shm", ""}) {
    const std::string from = path + suffix, to = out.damaged_copy + suffix;
    if (suffix[0] && !fs::exists(from, ec)) continue;
    if (std::rename(from.c_str(), to.c_str()) != 0)
      throw CacheError(fmt::format("cache {}: cannot rename {} to {}: {}; the salvaged rows are in {}", path, from, to,
                                   std::strerror(errno), fresh));
  }
  if (std::rename(fresh.c_str(), path.c_str()) != 0)
    throw CacheError(fmt::format("cache {}: cannot rename {} to {}: {}; the damaged original is {}", path, fresh, path,
                                 std::strerror(errno), out.damaged_copy));
  return out;
}

}  // namespace moeblaze
