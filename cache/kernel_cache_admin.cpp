// KernelCache administration: summary, export, import, verify, gc (the contract is in
// kernel_cache.hpp; the SQLite wrappers in kernel_cache_sqlite.hpp).
#include <fcntl.h>
#include <fmt/format.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "cache/kernel_cache_sqlite.hpp"

namespace moeblaze {
namespace fs = std::filesystem;
using namespace cache_detail;

namespace {

// Whether a binary is named by a winner: its kernel name (KernelSpec::name(),
// "mb_<family>_..._<config>") has the winner's family and ends with its config. Shapes are
// not compared, so this keeps a little more than needed, never less.
constexpr const char* kNamedByWinner =
    "EXISTS(SELECT 1 FROM winners w WHERE length(w.config) > 0 "
    "AND instr(binaries.kernel_name, '_' || w.family || '_') > 0 "
    "AND substr(binaries.kernel_name, -length(w.config) - 1) = '_' || w.config)";

}  // namespace

CacheSummary KernelCache::summary() {
  Connection& db = *impl_->db;
  CacheSummary s;
  s.path = impl_->path;
  s.schema_version = int(scalar(db, "PRAGMA user_version"));
  Statement q(db,
              "SELECT (SELECT count(*) FROM binaries), (SELECT coalesce(sum(length(cubin)), 0) FROM binaries), "
              "(SELECT count(*) FROM measurements), (SELECT count(*) FROM measurements WHERE status <> 'ok'), "
              "(SELECT count(*) FROM winners)",
              "summarising");
  q.step();
  s.binaries = q.integer(0);
  s.binary_bytes = q.integer(1);
  s.measurements = q.integer(2);
  s.failures = q.integer(3);
  s.winners = q.integer(4);
  // Bytes on disk: recent writes sit in the -wal file until a checkpoint moves them.
  std::error_code ec;
  for (const char* suffix : {"", "-wal"})
    if (const auto n = fs::file_size(impl_->path + suffix, ec); !ec) s.file_bytes += int64_t(n);
  return s;
}

void KernelCache::export_to(const std::string& file) {
  std::error_code ec;
  // symlink_status: a symbolic link to nothing exists too (VACUUM INTO would follow it).
  if (fs::exists(fs::symlink_status(file, ec)))
    throw CacheError(fmt::format("cache {}: cannot export to {}: {}{}", impl_->path, file, std::strerror(EEXIST),
                                 fs::is_symlink(fs::symlink_status(file, ec)) ? " (a symbolic link)" : ""));
  if (const fs::path folder = fs::path(file).parent_path(); !folder.empty()) fs::create_directories(folder, ec);
  // Created here, never through a link another process put there meanwhile; VACUUM INTO
  // takes an empty file.
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0)
    throw CacheError(fmt::format("cache {}: cannot export to {}: {}", impl_->path, file, std::strerror(errno)));
  ::close(fd);
  try {
    // VACUUM INTO writes a compact, consistent snapshot (header with application_id and
    // user_version included) and works on a read-only connection too.
    Statement s(*impl_->db, "VACUUM INTO ?", "exporting to " + file);
    s.bind_text(1, file_uri(file)).step();
    // An export is no cache: without the file id, a cache made from it gets its own.
    Connection copy(file, OpenAs::read_write);
    copy.exec("DROP TABLE IF EXISTS cache_file", "exporting to " + file);
  } catch (...) {
    fs::remove(file, ec);
    throw;
  }
}

VerifyReport KernelCache::verify(bool fix) {
  Connection& db = *impl_->db;
  VerifyReport r;
  std::vector<std::pair<std::string, std::vector<char>>> bad;  // key hash, the blob that failed
  try {
    {
      Statement check(db, "PRAGMA integrity_check(100)", "checking integrity");
      while (check.step())
        if (const std::string row = check.text(0); row != "ok") {
          r.integrity_ok = false;
          r.problems.push_back("integrity_check: " + row);
        }
    }
    Statement s(db, "SELECT key_hash, kernel_name, cubin, checksum, typeof(cubin) FROM binaries ORDER BY key_hash",
                "checking binaries");
    while (s.step()) {
      ++r.binaries_checked;
      std::vector<char> cubin = s.blob(2);
      const bool is_blob = s.text(4) == "blob";
      if (is_blob && checksum(cubin) == s.text(3)) continue;
      ++r.bad_checksums;
      r.problems.push_back(fmt::format("binary {} ({}) {}", s.text(0), s.text(1),
                                       is_blob ? "fails its checksum" : "is stored as " + s.text(4) + ", not a blob"));
      bad.emplace_back(s.text(0), std::move(cubin));
    }
  } catch (const SqliteError& e) {
    if (e.code != SQLITE_CORRUPT && e.code != SQLITE_NOTADB) throw;
    r.integrity_ok = false;
    r.problems.push_back(e.what());
  }
  // Deleting rows of a file whose pages are damaged could lose more than it fixes: that file is
  // only reported, and salvage() copies its readable rows instead.
  // The stored value is compared as bytes (a cubin stored as TEXT equals no blob), so that a
  // good copy another process stored meanwhile stays.
  if (fix && r.integrity_ok && !bad.empty())
    impl_->write("delete binaries that fail their checksum", [&] {
      Statement del(db, "DELETE FROM binaries WHERE key_hash = ? AND CAST(cubin AS BLOB) = ?", "deleting a bad binary");
      for (const auto& [hash, cubin] : bad) {
        del.reset();
        del.bind_text(1, hash).bind_blob(2, cubin).step();
        r.deleted += sqlite3_changes64(db.get());
      }
    });
  return r;
}

int64_t KernelCache::gc(int64_t max_bytes) {
  if (max_bytes < 0) throw CacheError(fmt::format("cache {}: gc: the size cap {} must not be negative", impl_->path, max_bytes));
  Connection& db = *impl_->db;
  int64_t deleted = 0;
  impl_->write("garbage-collect binaries", [&] {
    int64_t total = scalar(db, "SELECT coalesce(sum(length(cubin)), 0) FROM binaries");
    // Binaries no winner names first, then the rest; least recently used first in each.
    std::vector<std::string> victims;
    {
      Statement s(db, fmt::format("SELECT key_hash, length(cubin) FROM binaries ORDER BY {}, last_used, created", kNamedByWinner),
                  "choosing binaries to delete");
      while (total > max_bytes && s.step()) {
        victims.push_back(s.text(0));
        total -= s.integer(1);
      }
    }
    Statement del(db, "DELETE FROM binaries WHERE key_hash = ?", "deleting a binary");
    for (const std::string& hash : victims) {
      del.reset();
      del.bind_text(1, hash).step();
    }
    deleted = int64_t(victims.size());
  });
  // Gives freed pages back to the file system; skipped when there are none, since VACUUM
  // rewrites the whole file. The write above counted (even when it deleted nothing), so a
  // -wal from before the VACUUM, whose pages no longer fit the file, is older than the file.
  if (deleted > 0 || scalar(db, "PRAGMA freelist_count") > 0) db.exec("VACUUM", "vacuuming");
  return deleted;
}

}  // namespace moeblaze
