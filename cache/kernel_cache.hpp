// The SQLite cache: compiled kernel binaries and tuning results, in one file shared by
// every process of a user (the CLI, training processes, the Python binding).
//
// Practice (docs/design.md "Cache keys"): WAL journal on local disk, busy_timeout, short
// BEGIN IMMEDIATE write transactions, never a transaction open across a compile or a measurement;
// PRAGMA user_version for schema migrations; a checksum on every blob (a blob that fails it
// is deleted and reported, and the caller rebuilds it); a file that is not a moeblaze cache
// or is corrupt is moved aside and a fresh cache started, with a notice. Every measurement
// and every failure is kept, not only winners. Keys are stored in full beside their hash:
// a hash hit whose full key differs is a miss, never a crash.
#pragma once
#include <cstdint>
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
  std::string family;         // kernel family, e.g. "up_proj"
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
  int64_t binaries_checked = 0, bad_checksums = 0;  // bad rows are deleted when fix is true
  bool integrity_ok = true;                          // PRAGMA integrity_check
  std::vector<std::string> problems;
};

class KernelCache {
 public:
  // $MOEBLAZE_CACHE if set, else $XDG_CACHE_HOME/moeblaze/kernels.db, else
  // $HOME/.cache/moeblaze/kernels.db.
  static std::string default_path();

  // Opens (creating folders and file as needed) and migrates. A file that is not a
  // moeblaze cache (wrong application_id, newer schema, or not a database / corrupt) is
  // renamed to PATH.corrupt-<unix time> and a fresh cache is created; notices() says so.
  // Throws CacheError with the path and the reason when the file or its folder cannot be
  // read or written (read_only: opened without write; writes then throw).
  explicit KernelCache(const std::string& path, bool read_only = false);
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

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
  void export_to(const std::string& file);    // a portable SQLite file with every table
  int64_t import_from(const std::string& file);  // rows taken (insert or replace); validates the file first
  VerifyReport verify(bool fix);
  // Deletes binaries not named by a winner, oldest first, then any oldest binaries, until
  // the binary bytes are at most max_bytes; vacuums. Returns rows deleted.
  int64_t gc(int64_t max_bytes);

 private:
  struct Impl;
  Impl* impl_;
};

// 16-hex-digit hash used for cache keys.
std::string key_hash(const std::string& text);

}  // namespace moeblaze
