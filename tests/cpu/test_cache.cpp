// KernelCache (SQLite) tests, no GPU: schema and pragmas, round trips, keys that must miss,
// corrupt blobs, damaged, foreign and newer files (refused and left as they were, damaged ones
// salvaged on request), read-only and unusable paths, rollback of a failed write, eight
// processes writing at once, export/import, verify, gc and the summary. Imports of crafted
// files are in test_cache_import.cpp.
#include "cache_test_util.hpp"

using namespace cache_test;

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
        "family=gate_up;template=0123456789abcdef;shape=E=8 K=2 d=64 n=32 swiglu;bucket=1024;"
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
  const CachedBinary b = make_binary("mb_gate_up_E8_K2_d64_n32_swiglu_128x128x64_w2x4_s3", 100 * 1024, 1);
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

namespace {

// The files beside `path` whose names start with PATH.<what>- (kept originals, leftovers).
std::vector<fs::path> beside(const std::string& path, const std::string& what) {
  std::vector<fs::path> out;
  const std::string prefix = fs::path(path).filename().string() + "." + what + "-";
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(prefix) && !name.ends_with("-wal") && !name.ends_with("-shm")) out.push_back(e.path());
  }
  return out;
}

// Opening `path` (writable and read-only) throws a CacheError with `words`, and the file,
// its -wal and its -shm keep every byte; nothing is created beside them.
void check_refused_untouched(const std::string& path, const std::string& words) {
  const std::string before = read_file(path), wal = read_file(path + "-wal");
  for (bool read_only : {false, true}) {
    const std::string message = cache_error_of([&] { KernelCache c(path, read_only); });
    INFO(message);
    CHECK(contains(message, path));
    CHECK(contains(message, words));
  }
  // Not a byte of the file or its -wal changes (SQLite may add an empty -wal and its -shm index).
  CHECK(read_file(path) == before);
  CHECK(read_file(path + "-wal") == wal);
  CHECK(beside(path, "corrupt").empty());
  CHECK(beside(path, "damaged").empty());
  CHECK(beside(path, "salvage").empty());
}

// A cache of 30 binaries (10 KB each, so each spans overflow pages), 300 measurements and
// 12 winners, checkpointed into the main file.
struct FilledCache {
  std::vector<CachedBinary> binaries;
  std::vector<Measurement> measurements;
  std::vector<Winner> winners;
  explicit FilledCache(const std::string& path) {
    KernelCache c(path);
    for (int i = 0; i < 30; ++i) binaries.push_back(make_binary(fmt::format("mb_fill_{}", i), 10000, unsigned(i)));
    for (const auto& b : binaries) c.put_binary(b);
    for (int k = 0; k < 12; ++k) {
      const TuningKey key = make_key(int64_t{1} << k);
      std::vector<Measurement> ms;
      for (int i = 0; i < 25; ++i)
        ms.push_back(make_measurement(key, "128x128x64_w2x4_s3", i % 4 ? "ok" : "illegal", 1.0 + k + i / 100.0));
      c.add_measurements(ms);
      measurements.insert(measurements.end(), ms.begin(), ms.end());
      winners.push_back(make_winner(key, "128x256x64_w2x4_s4", 1.0 + k));
      c.put_winner(winners.back());
    }
  }
};

// Overwrites page `page` (1-based) of the file with noise.
void damage_page(const std::string& path, int64_t page, unsigned seed) {
  const std::vector<char> noise = random_blob(4096, seed);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp((page - 1) * 4096);
  f.write(noise.data(), 4096);
}

// Pages of one table's tree, from SQLite's dbstat table: "leaf", "overflow" or "internal".
std::vector<int64_t> pages_of(const std::string& path, const std::string& table, const std::string& type) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, "SELECT pageno FROM dbstat WHERE name = ?1 AND pagetype = ?2 ORDER BY pageno", -1, &s,
                             nullptr) == SQLITE_OK);
  sqlite3_bind_text(s, 1, table.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 2, type.c_str(), -1, SQLITE_TRANSIENT);
  std::vector<int64_t> pages;
  while (sqlite3_step(s) == SQLITE_ROW) pages.push_back(sqlite3_column_int64(s, 0));
  sqlite3_finalize(s);
  sqlite3_close(db);
  return pages;
}

// Rows plain SQLite can still read, id by id: the most a salvage can save.
int64_t readable_rows(const std::string& path, const std::string& table, const std::string& columns) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  int64_t n = 0;
  for (int64_t id = 1; id <= 1000; ++id) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db, fmt::format("SELECT {} FROM {} WHERE rowid = {}", columns, table, id).c_str(), -1, &s,
                           nullptr) != SQLITE_OK)
      break;
    n += sqlite3_step(s) == SQLITE_ROW;  // the step reads every column asked for, overflow pages included
    sqlite3_finalize(s);
  }
  sqlite3_close(db);
  return n;
}

// One binary and one winner, for the read-only tests.
struct FilledCacheForReadOnly {
  CachedBinary binary = make_binary("mb_ro_fill", 3000, 8);
  Winner winner = make_winner(make_key(), "128x128x64_w2x4_s3", 1.0);
  explicit FilledCacheForReadOnly(const std::string& path) {
    KernelCache c(path);
    c.put_binary(binary);
    c.put_winner(winner);
  }
};

}  // namespace

TEST_CASE("cache: a file that is not a cache is refused and left as it was") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  SUBCASE("random bytes, with -wal and -shm beside it") {
    const std::vector<char> noise = random_blob(8192, 5);
    write_file(path, std::string(noise.begin(), noise.end()));
    write_file(path + "-wal", "stale wal");
    write_file(path + "-shm", "stale shm");
    check_refused_untouched(path, "not an SQLite database");
  }
  SUBCASE("text") {
    write_file(path, "this is not a database\n");
    check_refused_untouched(path, "not an SQLite database");
    CHECK(contains(cache_error_of([&] { KernelCache::salvage(path); }), "no rows to salvage"));
    CHECK(read_file(path) == "this is not a database\n");
  }
  SUBCASE("another application_id") {
    RawDb(path).exec("PRAGMA application_id = 305419896; CREATE TABLE t(x); INSERT INTO t VALUES (42);");
    check_refused_untouched(path, "application_id 0x12345678");
    CHECK(contains(cache_error_of([&] { KernelCache::salvage(path); }), "not a moeblaze cache"));
    CHECK(RawDb(path).integer("SELECT x FROM t") == 42);
  }
  SUBCASE("no application_id, but tables") {
    RawDb(path).exec("CREATE TABLE t(x); INSERT INTO t VALUES (42);");
    check_refused_untouched(path, "not a moeblaze cache");
  }
}

TEST_CASE("cache: a newer schema is refused naming both versions, never moved") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  FilledCache filled(path);
  RawDb(path).exec(fmt::format("PRAGMA user_version = {}", kCacheSchemaVersion + 1));
  check_refused_untouched(path, fmt::format("schema version {} is newer than this build's {}", kCacheSchemaVersion + 1,
                                            kCacheSchemaVersion));
  CHECK(contains(cache_error_of([&] { KernelCache::salvage(path); }), "newer"));
  CHECK(RawDb(path).integer("SELECT count(*) FROM measurements") == 300);
}

TEST_CASE("cache: a damaged cache is refused, left in place, and salvaged on request") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  FilledCache filled(path);
  REQUIRE_FALSE(fs::exists(path + "-wal"));  // the last close checkpointed everything into the file
  const std::vector<int64_t> overflow = pages_of(path, "binaries", "overflow");
  const std::vector<int64_t> leaves = pages_of(path, "measurements", "leaf");
  REQUIRE(overflow.size() > 10);
  REQUIRE(leaves.size() > 3);
  // One page of one binary's blob, and one leaf in the middle of the measurements.
  damage_page(path, overflow[overflow.size() / 2], 6);
  damage_page(path, leaves[leaves.size() / 2], 7);
  const int64_t binaries_readable = readable_rows(path, "binaries", "key, cubin");
  const int64_t measurements_readable = readable_rows(path, "measurements", "key_hash");
  CHECK(binaries_readable >= 28);  // plain SQLite still reads most rows
  CHECK(measurements_readable >= 250);

  // Every open refuses it, names the damage and the command that salvages it, changes nothing.
  const std::string before = read_file(path);
  for (bool read_only : {false, true}) {
    try {
      KernelCache c(path, read_only);
      FAIL("a damaged cache was opened");
    } catch (const CacheDamaged& e) {
      CHECK(contains(e.what(), path));
      CHECK(contains(e.what(), "damaged"));
      CHECK(contains(e.what(), "verify --fix"));
      CHECK_FALSE(e.problems.empty());
    }
  }
  CHECK(read_file(path) == before);

  const SalvageReport r = KernelCache::salvage(path);
  CHECK(r.copied.binaries.taken + r.copied.binaries.unreadable + r.copied.skipped_rows() >= binaries_readable);
  CHECK(r.copied.binaries.taken >= binaries_readable - 1);  // the row with the damaged blob fails its checksum or read
  CHECK(r.copied.binaries.taken <= 30);
  CHECK(r.copied.measurements.taken == measurements_readable);
  CHECK(r.copied.winners.taken == 12);
  CHECK_FALSE(r.problems.empty());
  // The damaged original is kept beside it, byte for byte.
  REQUIRE(r.damaged_copy == beside(path, "damaged").at(0).string());
  CHECK(read_file(r.damaged_copy) == before);
  CHECK(beside(path, "salvage").empty());
  // The fresh cache opens, passes verify, and holds exactly the original rows that survived.
  KernelCache c(path);
  const VerifyReport v = c.verify(false);
  CHECK(v.integrity_ok);
  CHECK(v.bad_checksums == 0);
  int64_t found = 0;
  for (const auto& b : filled.binaries)
    if (auto got = c.find_binary(b.key_hash, b.key)) {
      check_same(*got, b);
      ++found;
    }
  CHECK(found == r.copied.binaries.taken);
  for (const auto& w : filled.winners) {
    const auto got = c.find_winner(w.key);
    REQUIRE(got);
    CHECK(got->config == w.config);
    CHECK(got->median_ms == w.median_ms);
  }
  CHECK(c.summary().measurements == r.copied.measurements.taken);
  CHECK(c.summary().winners == 12);
}

TEST_CASE("cache: salvage steps over a damaged interior page and a lost table") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  FilledCache filled(path);
  SUBCASE("every measurement leaf but the first and last") {
    const std::vector<int64_t> leaves = pages_of(path, "measurements", "leaf");
    REQUIRE(leaves.size() > 3);
    for (size_t i = 1; i + 1 < leaves.size(); ++i) damage_page(path, leaves[i], unsigned(100 + i));
    const SalvageReport r = KernelCache::salvage(path);
    CHECK(r.copied.measurements.taken > 0);
    CHECK(r.copied.measurements.taken < 300);
    CHECK(r.copied.measurements.damaged_ranges >= 1);
    CHECK(r.copied.binaries.taken == 30);
    CHECK(r.copied.winners.taken == 12);
  }
  SUBCASE("the root page of the winners") {
    std::vector<int64_t> root = pages_of(path, "winners", "internal");
    if (root.empty()) root = pages_of(path, "winners", "leaf");  // a single page is the root
    REQUIRE(root.size() == 1);
    damage_page(path, root[0], 9);
    const SalvageReport r = KernelCache::salvage(path);
    CHECK(r.copied.winners.taken == 0);
    CHECK(r.copied.binaries.taken == 30);
    CHECK(r.copied.measurements.taken == 300);
  }
  KernelCache c(path);
  CHECK(c.verify(false).integrity_ok);
  CHECK(beside(path, "damaged").size() == 1);
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
        cache_error_of([&] { (void)ro.import_from(path); })}) {
    CHECK(contains(message, "read-only"));
    CHECK(contains(message, path));
  }
  CHECK(ro.find_binary(b.key_hash, b.key));  // nothing changed

  // Read-only never creates.
  const std::string missing = dir.file("missing.db");
  CHECK(contains(cache_error_of([&] { KernelCache m(missing, true); }), missing));
  CHECK_FALSE(fs::exists(missing));
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

  // A FIFO would block open() until a writer came; a device is no cache either.
  const std::string fifo = dir.file("fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  for (const auto& [path, words] : {std::pair{fifo, std::string("a FIFO")}, std::pair{std::string("/dev/null"),
                                                                                    std::string("a character device")}})
    CHECK(run_in_child(
              [&, path = path, words = words]() -> std::string {
                for (bool read_only : {false, true}) {
                  const std::string m = cache_error_of_quiet([&] { KernelCache c(path, read_only); });
                  if (!contains(m, path) || !contains(m, words) || !contains(m, "not a regular file"))
                    return "message: " + m;
                }
                return "";
              },
              false) == "");
  CHECK(fs::is_fifo(fifo));
}

TEST_CASE("cache: a new cache is private: folders 0700, file 0600") {
  TempDir dir;
  const std::string path = dir.file("a/b/kernels.db");
  KernelCache c(path);
  c.put_binary(make_binary("mb_private", 1000, 1));
  const auto private_dir = fs::perms::owner_all;
  const auto private_file = fs::perms::owner_read | fs::perms::owner_write;
  CHECK((fs::status(dir.path / "a").permissions() & fs::perms::all) == private_dir);
  CHECK((fs::status(dir.path / "a/b").permissions() & fs::perms::all) == private_dir);
  CHECK((fs::status(path).permissions() & fs::perms::all) == private_file);
  REQUIRE(fs::exists(path + "-wal"));
  CHECK((fs::status(path + "-wal").permissions() & fs::perms::all) == private_file);
  // An existing folder keeps its mode.
  CHECK((fs::status(dir.path).permissions() & fs::perms::all) != private_dir);
}

TEST_CASE("cache: read-only files and folders are read, and never written") {
  TempDir dir;
  const fs::path folder = dir.path / "ro";
  const std::string path = (folder / "kernels.db").string();
  FilledCacheForReadOnly filled(path);
  std::string before;
  bool folder_read_only = false;
  SUBCASE("a read-only folder") {
    folder_read_only = true;
    fs::permissions(path, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
    fs::permissions(folder, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);  // 0555
  }
  SUBCASE("a read-only file (0444) in a folder others may write") {
    fs::permissions(path, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
    fs::permissions(folder, fs::perms::all);
  }
  before = read_file(path);
  const std::string failed = run_in_child([&]() -> std::string {
    for (bool read_only : {true, false}) {
      KernelCache c(path, read_only);
      if (c.writable()) return "opened writable";
      if (!read_only && (c.notices().empty() || !contains(c.notices()[0], "read-only")))
        return "no notice that the cache is read-only";
      const auto found = c.find_binary(filled.binary.key_hash, filled.binary.key);
      if (!found || found->cubin != filled.binary.cubin) return "binary not read";
      if (!c.find_winner(filled.winner.key)) return "winner not read";
      if (c.summary().binaries != 1) return "summary";
      if (!c.verify(false).problems.empty()) return "verify";
      for (const std::string& m :
           {cache_error_of_quiet([&] { c.put_binary(filled.binary); }), cache_error_of_quiet([&] { c.gc(0); }),
            cache_error_of_quiet([&] { (void)c.import_from(path); })})
        if (!contains(m, "read-only") || !contains(m, path)) return "write: " + m;
    }
    return "";
  });
  CHECK(failed == "");
  CHECK(read_file(path) == before);
  // A new file cannot be made in a read-only folder: the error names the folder and the reason.
  if (folder_read_only) {
    const std::string fresh = (folder / "new.db").string();
    CHECK(run_in_child([&]() -> std::string {
            const std::string e = cache_error_of_quiet([&] { KernelCache c(fresh); });
            return contains(e, folder.string()) && contains(e, "Permission denied") ? "" : "message: " + e;
          }) == "");
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
  const ImportReport r = b.import_from(exported);
  CHECK(r.binaries.taken == 3);
  CHECK(r.measurements.taken == 5);
  CHECK(r.winners.taken == 2);
  CHECK(r.taken() == 3 + 5 + 2);
  CHECK(r.skipped.empty());
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
    const std::string message = cache_error_of([&] { (void)c.import_from(file); });
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
    bins.push_back(make_binary("mb_gate_up_E8_K2_d64_n32_swiglu_" + configs[size_t(i)], 10000, unsigned(i)));
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
