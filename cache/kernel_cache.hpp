// The SQLite cache: compiled kernel binaries and tuning results, in one file shared by
// every process of a user (the CLI, training processes, the Python binding).
//
// Practice (docs/design.md "Cache keys"): WAL journal on local disk, busy_timeout, short
// BEGIN IMMEDIATE write transactions, never a transaction open across a compile or a measurement;
// PRAGMA user_version for schema migrations; a checksum on every blob (a blob that fails it
// is deleted and reported, and the caller rebuilds it). Every measurement and every failure
// is kept, not only winners. Keys are stored in full beside their hash: a hash hit whose full
// key differs is a miss, never a crash.
//
// The file holds a user's tuning hours, so nothing here moves, empties or replaces it on its
// own: a file that is damaged, foreign, of a newer schema or not a regular file is refused
// with a CacheError naming the problem and left as it was. Only `salvage` (the explicit
// `moeblaze cache verify --fix`) writes a fresh file, and it keeps the original beside it.
// A cache that cannot be written (file mode, read-only folder or file system) is opened for
// reading, and writes then say that it is read-only. A new folder is created 0700 and a new
// file 0600: importing or loading a cache means running its GPU code (README "Trust").
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace moeblaze {

// Bump when the schema changes; open() migrates older files forward.
constexpr int kCacheSchemaVersion = 1;

struct CacheError : std::exception {
  std::string message;
  explicit CacheError(std::string m) : message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
};

// The file is a moeblaze cache whose pages are damaged (quick_check or a read failed). It is
// left in place; `problems` holds SQLite's findings.
struct CacheDamaged : CacheError {
  std::vector<std::string> problems;
  CacheDamaged(std::string m, std::vector<std::string> p) : CacheError(std::move(m)), problems(std::move(p)) {}
};

// The PATH-wal beside the cache is not its own: another file's, older than the file, or
// written by something that does not count its writes (kernel_cache_wal.cpp has the rule).
// SQLite would fold it into the file; it is refused and left as it is.
struct CacheWalRefused : CacheError {
  std::string wal, reason;
  CacheWalRefused(std::string m, std::string w, std::string why)
      : CacheError(std::move(m)), wal(std::move(w)), reason(std::move(why)) {}
};

// A compiled kernel. `key` is the full binary key (generator version, template hash,
// specialisation, options, arch, NVRTC version); `key_hash` its 16-hex-digit hash.
struct CachedBinary {
  std::string key_hash, key;
  std::string kernel_name, arch, nvrtc_version;
  std::vector<char> cubin;
  int registers = 0, spill_bytes = 0, static_smem = 0, dynamic_smem = 0, threads = 0;
  std::string log;  // NVRTC log (ptxas report)
};

// What a tuning result is valid for.
struct TuningKey {
  std::string family;         // kernel family, e.g. "gate_up"
  std::string template_hash;  // hash of the kernel templates
  std::string shape;          // layer shape compiled in, e.g. "E=128 K=8 d=2048 n=768 swiglu router=softmax,renorm"
  int64_t token_bucket = 0;   // tokens rounded up to a power of two
  std::string device;         // fingerprint: name, compute capability, SM count, driver
  std::string policy;         // measurement policy: routing distribution, L2 (e.g. "routing=router;l2=rotated")
  std::string text() const;   // every field, one line, stable order
  std::string hash() const;   // 16 hex digits of a 64-bit hash of text()
};

// One timed (or failed) candidate. status: "ok", "illegal", "compile_failed",
// "run_failed", "wrong_result".
struct Measurement {
  TuningKey key;
  std::string config;  // tile config, e.g. "128x128x64_w2x4_s4"
  std::string status = "ok";
  double median_ms = 0, spread_ms = 0;  // spread: (p90 - p10) / 2 of the samples
  int samples = 0;
  std::string detail;  // why it failed, or extra notes
  double created = 0;  // unix time, set by the cache
};

struct Winner {
  TuningKey key;
  std::string config;
  double median_ms = 0, spread_ms = 0, default_ms = 0;  // winner and default under the same run
  double created = 0;
};

struct CacheSummary {
  std::string path;
  int schema_version = 0;
  int64_t binaries = 0, binary_bytes = 0, measurements = 0, failures = 0, winners = 0;
  int64_t file_bytes = 0;
};

struct VerifyReport {
  int64_t binaries_checked = 0, bad_checksums = 0;  // bad rows (a checksum that fails, a cubin not stored as a blob)
  int64_t deleted = 0;                               // bad rows deleted (fix, on an intact file)
  bool integrity_ok = true;                          // PRAGMA integrity_check (nothing is deleted when it fails)
  std::vector<std::string> problems;
};

// What an import (or a salvage) took from a file, per table, and why it left rows out.
struct TableCopy {
  int64_t read = 0;        // rows read from the file
  int64_t taken = 0;       // rows written into the cache
  int64_t duplicates = 0;  // rows the cache already had (natural key), so nothing was written
  int64_t unreadable = 0;  // rows whose pages could not be read (salvage only)
  int64_t damaged_ranges = 0;  // runs of ids skipped because a page of the table's tree is damaged (salvage only)
};
struct ImportReport {
  TableCopy binaries, measurements, winners;
  std::map<std::string, int64_t> skipped;  // "table.column: problem" -> rows left out because they failed a check
  std::vector<std::string> notes;          // tables that could not be read at all (salvage)
  int64_t taken() const { return binaries.taken + measurements.taken + winners.taken; }
  int64_t skipped_rows() const;
};

// Upper bounds of what one import takes (docs/cache.md "Limits"); a file beyond max_file_bytes is
// refused, rows beyond max_rows per table and values beyond the byte limits are skipped.
struct ImportLimits {
  int64_t max_file_bytes = int64_t{16} << 30;
  int64_t max_rows = 1'000'000;          // per table
  int64_t max_blob_bytes = int64_t{64} << 20;  // one cubin
  int64_t max_text_bytes = 64 << 10;      // one key, name, shape, ... field
  int64_t max_log_bytes = 4 << 20;        // one NVRTC log or failure detail
};

// Checks of a tuning row that need the generator (layers above the cache supply it, see
// runtime/cache_keys.hpp): empty when `family` is a kernel family and `config` a tile of it,
// else the reason.
using TuningRowCheck = std::function<std::string(const std::string& family, const std::string& config)>;

// What `salvage` did: rows copied into the fresh file, what was lost, where the original went.
struct SalvageReport {
  ImportReport copied;
  std::string damaged_copy;  // the original, renamed beside the cache (never deleted)
  std::vector<std::string> problems;  // what quick_check reported before the copy
};

class KernelCache {
 public:
  // $MOEBLAZE_CACHE if set, else $XDG_CACHE_HOME/moeblaze/kernels.db, else
  // $HOME/.cache/moeblaze/kernels.db.
  static std::string default_path();

  // Opens and migrates; writable unless read_only or the file or its folder cannot be written
  // (then reads only, with a notice). A missing file is created (0600, its folders 0700)
  // unless read_only. Throws CacheError naming the path and the reason, and changes nothing,
  // when the path is not a regular file, cannot be read, is not an SQLite database, belongs
  // to another application, has a newer schema version (both versions named), or is damaged
  // (CacheDamaged: `moeblaze cache verify --fix` salvages it).
  //
  // A PATH-wal that no process has open (left by a crash, or put there by hand) is folded in
  // only when it is this cache's own; else CacheWalRefused. take_wal skips that check: the
  // caller knows the -wal is this cache's (`moeblaze cache verify --take-wal`), and the file
  // gets a fresh file id.
  explicit KernelCache(const std::string& path, bool read_only = false, bool take_wal = false);
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // Copies every readable, valid row of the damaged cache at `path` into a fresh file (row by
  // row, skipping unreadable pages), renames the original to PATH.damaged-<time> (with its
  // -wal and -shm) and puts the fresh file at PATH. Refuses files that are not SQLite
  // databases, belong to another application or have a newer schema. Run it while no other
  // process uses the cache.
  static SalvageReport salvage(const std::string& path, const TuningRowCheck& check = {});

  // Renames a PATH-wal that is not the cache's own (and its -shm) to PATH-wal.refused-<time>,
  // kept beside it, never deleted; returns that name, or "" when there was none to move (no
  // leftover -wal, or it is the cache's own, or a process has it open).
  static std::string set_aside_refused_wal(const std::string& path);

  // False when the cache was opened for reading only (asked for, or the file is read-only).
  bool writable() const;
  const std::string& path() const;
  const std::vector<std::string>& notices() const;

  // Binaries. find: nullopt on a miss, on a full-key mismatch, or when the checksum fails
  // (that row is then deleted and a notice added).
  std::optional<CachedBinary> find_binary(const std::string& key_hash, const std::string& key);
  void put_binary(const CachedBinary& b);  // insert or replace, one short transaction

  // Tuning results. Every measurement is appended; winners are one per key hash.
  void add_measurements(const std::vector<Measurement>& m);  // one short transaction
  std::vector<Measurement> measurements(const std::string& tuning_key_hash);
  void put_winner(const Winner& w);
  std::optional<Winner> find_winner(const TuningKey& key);  // exact: hash and full text
  // Winners with the same family, template hash, shape and device (any bucket and policy),
  // for the runtime's fallback (same bucket, then nearest bucket within 2x).
  std::vector<Winner> winners_for(const std::string& family, const std::string& template_hash,
                                  const std::string& shape, const std::string& device);
  std::vector<Winner> all_winners();

  // Administration.
  CacheSummary summary();
  void export_to(const std::string& file);  // a portable SQLite file with every table
  // Takes the valid rows of an exported file. The file is opened read-only and defensively
  // (trusted_schema off, no views or triggers), must be a moeblaze export of this schema whose
  // three tables are real tables with the expected columns, and must pass quick_check; each row
  // is checked (types, finite numbers, key hashes, checksums, ELF cubins, no control
  // characters, `check` for families and tiles) and left out with a reason when it fails;
  // rows the cache already has (same natural key) are not written again.
  ImportReport import_from(const std::string& file, const TuningRowCheck& check = {}, const ImportLimits& limits = {});
  // integrity_check and every blob's checksum. fix: deletes binaries whose checksum fails
  // (they are rebuilt on demand); a failed integrity check is only reported (see salvage).
  VerifyReport verify(bool fix);
  // Deletes binaries not named by a winner, oldest first, then any oldest binaries, until
  // the binary bytes are at most max_bytes (nothing when they already are); vacuums.
  // Tuning results are never deleted. Returns rows deleted.
  int64_t gc(int64_t max_bytes);

 private:
  struct Impl;
  Impl* impl_;
};

// 16-hex-digit hash used for cache keys.
std::string key_hash(const std::string& text);

}  // namespace moeblaze
