// Whose -wal is it? SQLite folds a PATH-wal into PATH whenever the frames validate (their salts
// and running checksums), and nothing in a -wal names the file it was written for: another
// cache's -wal copied beside this one validates, and the next checkpoint (gc's VACUUM, or any
// writer closing) makes its pages this file's. The rule (docs/design.md "Cache keys"):
//
// - Every cache holds a random file id and a write count in table cache_file, and every write
//   transaction of moeblaze adds one to the count (WriteTransaction), so each transaction in a
//   -wal carries the page of that row.
// - A -wal that a process has open (a lock on the DMS byte of PATH-shm) is live: the process
//   that opened it first checked it. A -wal that no process has open was left by a crash or put
//   there by hand. Then, holding the file exclusively, it is the cache's own when
//     * it would change nothing (no committed frame, or every committed page image already in
//       the file), or the file holds nothing yet (no tables: nothing to lose); else
//     * the file holds a file id (without one, whose -wal it is cannot be told), the file seen
//       through the -wal has the same id (else it is another file's) and a write count at least
//       the file's own (else it is older than the file), and the -wal holds the page of that
//       row (else it was written by something that does not count its writes).
// - A -wal that is not the cache's own is refused (CacheWalRefused) and left as it is; only
//   `moeblaze cache verify --fix` (sets it aside) or `--take-wal` (folds it in) act on it.
#include <fmt/format.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "cache/kernel_cache_sqlite.hpp"

namespace moeblaze {
using namespace cache_detail;

namespace {

constexpr int64_t kWalHeaderBytes = 32, kFrameHeaderBytes = 24;
constexpr uint32_t kWalMagic = 0x377f0682;  // the low bit: checksums of big-endian words
constexpr int64_t kShmDeadManByte = 128;    // unix VFS: every connection holds a read lock here

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}
uint32_t le32(const unsigned char* p) {
  return (uint32_t(p[3]) << 24) | (uint32_t(p[2]) << 16) | (uint32_t(p[1]) << 8) | uint32_t(p[0]);
}

// wal.c's walChecksumBytes: a running pair over 32-bit words, read in the byte order the magic
// names.
void wal_checksum(bool big_endian, const unsigned char* data, size_t n, uint32_t sum[2]) {
  uint32_t s1 = sum[0], s2 = sum[1];
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint32_t w0 = big_endian ? be32(data + i) : le32(data + i);
    const uint32_t w1 = big_endian ? be32(data + i + 4) : le32(data + i + 4);
    s1 += w0 + s2;
    s2 += w1 + s1;
  }
  sum[0] = s1;
  sum[1] = s2;
}

// The frames SQLite's recovery would take from a -wal (wal.c walIndexRecover): frames whose
// salts match the header and whose running checksum holds, up to the last commit frame.
struct WalFrames {
  uint32_t page_size = 0;
  uint32_t pages_after = 0;                // database size in pages after the last commit
  std::map<uint32_t, int64_t> last_image;  // page number -> offset of its newest committed image
};

WalFrames read_wal_frames(const std::string& wal_path) {
  WalFrames out;
  std::ifstream f(wal_path, std::ios::binary);
  unsigned char h[kWalHeaderBytes];
  if (!f.read(reinterpret_cast<char*>(h), sizeof h)) return out;
  const uint32_t magic = be32(h), page_size = be32(h + 8);
  if ((magic & ~1u) != kWalMagic || page_size < 512 || page_size > 65536 || (page_size & (page_size - 1)))
    return out;
  const bool big_endian = magic & 1;
  uint32_t sum[2] = {0, 0};
  wal_checksum(big_endian, h, 24, sum);
  if (sum[0] != be32(h + 24) || sum[1] != be32(h + 28)) return out;
  std::vector<std::pair<uint32_t, int64_t>> frames;  // page, offset of its image
  size_t committed = 0;                                // frames up to the last commit frame
  std::vector<unsigned char> frame(size_t(kFrameHeaderBytes) + page_size);
  for (int64_t at = kWalHeaderBytes; f.read(reinterpret_cast<char*>(frame.data()), std::streamsize(frame.size()));
       at += int64_t(frame.size())) {
    const uint32_t page = be32(frame.data()), commit_size = be32(frame.data() + 4);
    if (page == 0 || std::memcmp(frame.data() + 8, h + 16, 8) != 0) break;
    wal_checksum(big_endian, frame.data(), 8, sum);
    wal_checksum(big_endian, frame.data() + kFrameHeaderBytes, page_size, sum);
    if (sum[0] != be32(frame.data() + 16) || sum[1] != be32(frame.data() + 20)) break;
    frames.emplace_back(page, at + kFrameHeaderBytes);
    if (commit_size != 0) {
      committed = frames.size();
      out.pages_after = commit_size;
    }
  }
  for (size_t i = 0; i < committed; ++i) out.last_image[frames[i].first] = frames[i].second;
  if (committed > 0) out.page_size = page_size;
  return out;
}

// Whether a process has PATH's WAL index open: SQLite's unix VFS keeps a read lock on the
// DMS byte of PATH-shm for as long as a connection uses it. Read from /proc/locks, which lists
// every process's locks (this one's too) and needs no file descriptor: opening and closing
// PATH-shm here would drop this process's own SQLite locks on it (POSIX record locks belong
// to the process). nullopt when /proc/locks cannot be read.
std::optional<bool> wal_index_in_use(const std::string& path) {
  struct stat shm;
  if (::stat((path + "-shm").c_str(), &shm) != 0) return false;  // no index: nobody uses the -wal
  std::ifstream locks("/proc/locks");
  if (!locks) return std::nullopt;
  for (std::string line; std::getline(locks, line);) {
    std::istringstream in(line);
    std::vector<std::string> field;
    for (std::string w; in >> w;)
      if (w != "->") field.push_back(w);
    // "1: POSIX  ADVISORY  READ 4242 fe:00:10961124 128 128"; the device is not compared (an
    // overlay file system reports another device than stat() does), the inode is.
    if (field.size() < 8 || field[1] != "POSIX") continue;
    const std::string& id = field[5];
    const size_t colon = id.rfind(':');
    if (colon == std::string::npos || id.substr(colon + 1) != std::to_string(shm.st_ino)) continue;
    const long long start = std::atoll(field[6].c_str());
    const bool to_end = field[7] == "EOF";
    if (start <= kShmDeadManByte && (to_end || std::atoll(field[7].c_str()) >= kShmDeadManByte)) return true;
  }
  return false;
}

// A connection that has PATH to itself until it closes (SQLite's exclusive locking mode, which
// reads a -wal into private memory instead of PATH-shm), or nullptr while another connection
// holds a lock. Closing it never checkpoints.
std::unique_ptr<Connection> lock_exclusively(const std::string& path) {
  auto c = std::make_unique<Connection>(path, OpenAs::read_write);
  if (const int rc = sqlite3_db_config(c->get(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr); rc != SQLITE_OK)
    c->fail(rc, "opening to check its -wal");
  sqlite3_busy_timeout(c->get(), 0);
  c->exec("PRAGMA locking_mode = EXCLUSIVE", "opening to check its -wal");
  try {
    c->exec("BEGIN EXCLUSIVE", "opening to check its -wal");
  } catch (const SqliteError& e) {
    if (e.code == SQLITE_BUSY || e.code == SQLITE_LOCKED) return nullptr;
    throw;
  }
  return c;
}

// The file id and write count a connection sees, and the page that holds them.
struct FileStamp {
  std::string id;
  int64_t writes = 0;
  int64_t page = 0;
};
std::optional<FileStamp> read_stamp(Connection& c) {
  if (scalar(c, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'cache_file'") == 0)
    return std::nullopt;
  Statement s(c, "SELECT id, writes, (SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = "
                 "'cache_file') FROM cache_file",
              "reading the file id");
  if (!s.step()) return std::nullopt;
  return FileStamp{s.text(0), s.integer(1), s.integer(2)};
}

// Whether folding the frames in would change a byte of the file (read through the
// connection's own descriptor: a second one, closed here, would drop the locks this process
// holds on the file).
bool wal_changes_file(const WalFrames& w, const std::string& wal_path, Connection& file_only) {
  sqlite3_file* f = nullptr;
  if (sqlite3_file_control(file_only.get(), "main", SQLITE_FCNTL_FILE_POINTER, &f) != SQLITE_OK || !f || !f->pMethods)
    return true;
  sqlite3_int64 size = 0;
  if (f->pMethods->xFileSize(f, &size) != SQLITE_OK) return true;
  unsigned char header[100] = {};
  if (size < int64_t(sizeof header) || f->pMethods->xRead(f, header, sizeof header, 0) != SQLITE_OK) return true;
  const uint32_t page_size = (uint32_t(header[16]) << 8 | header[17]) == 1 ? 65536 : (uint32_t(header[16]) << 8 | header[17]);
  if (page_size != w.page_size || int64_t(w.pages_after) * page_size != size) return true;
  std::ifstream wal(wal_path, std::ios::binary);
  std::vector<char> image(page_size), current(page_size);
  for (const auto& [page, offset] : w.last_image) {
    if (!wal.seekg(offset) || !wal.read(image.data(), page_size)) return true;
    const int64_t at = int64_t(page - 1) * page_size;
    if (at + page_size > size || f->pMethods->xRead(f, current.data(), int(page_size), at) != SQLITE_OK) return true;
    if (image != current) return true;
  }
  return false;
}

// Why the -wal beside PATH is not the cache's own ("" when it is), while `locked` holds PATH
// exclusively.
std::string foreign_wal_problem(const std::string& path, Connection& locked) {
  const std::string wal = path + "-wal";
  const WalFrames frames = read_wal_frames(wal);
  if (frames.last_image.empty()) return "";  // SQLite takes nothing from it
  std::unique_ptr<Connection> file_only;
  std::optional<FileStamp> own;
  int64_t tables = 0;
  try {
    file_only = std::make_unique<Connection>(path, OpenAs::immutable);  // PATH alone, its -wal not read
    tables = scalar(*file_only, "SELECT count(*) FROM sqlite_master WHERE type = 'table'");
    own = read_stamp(*file_only);
  } catch (const SqliteError&) {
    return "";  // the file itself is damaged: opening refuses it as such, and nothing is folded in
  }
  if (!wal_changes_file(frames, wal, *file_only)) return "";
  if (tables == 0) return "";  // nothing to lose: a fresh cache whose first writes are in the -wal
  if (!own)
    return "the file has no file id (a moeblaze before file ids kept it), so whose -wal it is cannot be told";
  std::optional<FileStamp> seen;
  try {
    seen = read_stamp(locked);
  } catch (const SqliteError& e) {
    return fmt::format("read through it, the file is not readable ({})", e.what());
  }
  if (!seen || seen->id != own->id)
    return fmt::format("it belongs to another file (file id {} through the -wal, {} in the file)",
                       seen ? seen->id : std::string("none"), own->id);
  if (seen->writes < own->writes)
    return fmt::format("it is older than the file (write {} in the -wal, {} in the file)", seen->writes, own->writes);
  if (!frames.last_image.count(uint32_t(seen->page)))
    return "it was not written by moeblaze for this file (none of its transactions counts a write)";
  return "";
}

CacheWalRefused refusal(const std::string& path, const std::string& why) {
  return CacheWalRefused(
      fmt::format("cache {}: the {}-wal beside it is not this cache's own: {}. Nothing was changed, and nothing "
                  "writes to the cache while it is there. `moeblaze cache verify --fix --db {}` sets it aside (kept, "
                  "never deleted); `moeblaze cache verify --take-wal --db {}` folds it in if you know it is this "
                  "cache's. Copy a cache with `moeblaze cache export`, never with cp",
                  path, path, why, path, path),
      path + "-wal", why);
}

// Runs `with_lock(connection)` while PATH's leftover -wal (one no process has open) is held
// exclusively; returns false without running it when there is no -wal with frames or it is
// live. Another process checking the same file at once holds the lock for a moment: waited for.
template <class F>
bool with_leftover_wal_locked(const std::string& path, F&& with_lock) {
  struct stat wal;
  if (::stat((path + "-wal").c_str(), &wal) != 0 || wal.st_size < kWalHeaderBytes + kFrameHeaderBytes + 512)
    return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
  for (;;) {
    const std::optional<bool> in_use = wal_index_in_use(path);
    if (in_use.value_or(false)) return false;
    std::unique_ptr<Connection> locked;
    try {
      locked = lock_exclusively(path);
    } catch (const SqliteError&) {
      return false;  // not a database, damaged, ...: opening refuses such a file, and folds nothing in
    }
    if (locked) {
      with_lock(*locked);
      return true;
    }
    // Busy, yet no process has the index open: another process is checking, or a connection
    // is between its two locks. Without /proc/locks a busy file is taken to be in use.
    if (!in_use || std::chrono::steady_clock::now() > deadline) {
      if (!in_use) return false;
      throw CacheError(fmt::format("cache {}: its -wal could not be checked: the file stayed locked for {} s", path,
                                   kBusyTimeoutMs / 1000));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

namespace cache_detail {

void check_leftover_wal(const std::string& path) {
  with_leftover_wal_locked(path, [&](Connection& locked) {
    if (const std::string why = foreign_wal_problem(path, locked); !why.empty()) throw refusal(path, why);
  });
}

}  // namespace cache_detail

std::string KernelCache::set_aside_refused_wal(const std::string& path) {
  std::string moved;
  with_leftover_wal_locked(path, [&](Connection& locked) {
    if (foreign_wal_problem(path, locked).empty()) return;
    std::string suffix = fmt::format(".refused-{}", static_cast<long long>(std::time(nullptr)));
    for (int i = 1; ::access((path + "-wal" + suffix).c_str(), F_OK) == 0; ++i)
      suffix = fmt::format(".refused-{}-{}", static_cast<long long>(std::time(nullptr)), i);
    const std::string to = path + "-wal" + suffix;
    // Under the lock: no process opens the file meanwhile, so none can meet the -wal half-moved.
    if (std::rename((path + "-wal").c_str(), to.c_str()) != 0)
      throw CacheError(fmt::format("cache {}: cannot rename {}-wal to {}: {}", path, path, to, std::strerror(errno)));
    // Its index describes the -wal that went: kept beside it too, never deleted.
    if (::access((path + "-shm").c_str(), F_OK) == 0)
      std::rename((path + "-shm").c_str(), (path + "-shm" + suffix).c_str());
    moved = to;
  });
  return moved;
}

}  // namespace moeblaze
