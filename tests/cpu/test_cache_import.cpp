// Importing cache files that were not made by moeblaze, no GPU: crafted files (views, virtual
// tables, generated columns, triggers, wrong types, NaN and infinities, control characters,
// bad checksums, unparsable tiles, unknown families, row and byte caps), re-imports that must
// add nothing, a bad winner at load time, and a seeded fuzz of the import path (print the
// seed; MOEBLAZE_FUZZ_SEED=N repeats a run, MOEBLAZE_FUZZ_ROUNDS=N changes its length).
#include <csignal>
#include <cstdio>

#include "cache_test_util.hpp"
#include "generator/heuristics.hpp"
#include "generator/layer_config.hpp"
#include "runtime/cache_keys.hpp"
#include "runtime/kernel_loader.hpp"

using namespace cache_test;

namespace {

constexpr const char* kTile = "128x128x64_w8x1_s3_wgmma";

// An export of 3 binaries, 6 measurements and 2 winners whose families and tiles are real.
struct Export {
  std::vector<CachedBinary> binaries;
  std::vector<Measurement> measurements;
  std::vector<Winner> winners;
  std::string file;
  Export(const TempDir& dir, const std::string& name) : file(dir.file(name)) {
    const std::string source = dir.file(name + ".source.db");
    KernelCache c(source);
    for (int i = 0; i < 3; ++i) binaries.push_back(make_binary(fmt::format("mb_gate_up_import_{}", i), 4000, unsigned(i)));
    for (const auto& b : binaries) c.put_binary(b);
    for (int k = 0; k < 2; ++k) {
      const TuningKey key = make_key(1024 << k);
      std::vector<Measurement> ms;
      for (int i = 0; i < 3; ++i) ms.push_back(make_measurement(key, kTile, i == 2 ? "illegal" : "ok", 1.0 + k + i / 10.0));
      c.add_measurements(ms);
      measurements.insert(measurements.end(), ms.begin(), ms.end());
      winners.push_back(make_winner(key, kTile, 1.0 + k));
      c.put_winner(winners.back());
    }
    c.export_to(file);
  }
};

// A fresh cache with one row of its own, and what import must leave of it.
struct Target {
  std::string path;
  KernelCache cache;
  CachedBinary own = make_binary("mb_own", 2000, 77);
  explicit Target(const TempDir& dir, const std::string& name = "target.db") : path(dir.file(name)), cache(path) {
    cache.put_binary(own);
  }
  void check_unchanged() {
    const CacheSummary s = cache.summary();
    CHECK(s.binaries == 1);
    CHECK(s.measurements == 0);
    CHECK(s.winners == 0);
    CHECK(cache.find_binary(own.key_hash, own.key));
  }
};

// A crafted row in `table` whose key fields and key text agree (so a later check is the one
// that refuses it).
void insert_winner(RawDb& db, const TuningKey& k, const std::string& config, const std::string& median = "1.0") {
  db.exec(fmt::format("INSERT INTO winners(key_hash, key_text, family, template_hash, shape, token_bucket, device, policy, "
                      "config, median_ms, spread_ms, default_ms, created) VALUES('{}', '{}', '{}', '{}', '{}', {}, '{}', "
                      "'{}', '{}', {}, 0.01, 1.5, 1700000000)",
                      k.hash(), k.text(), k.family, k.template_hash, k.shape, k.token_bucket, k.device, k.policy, config,
                      median));
}

ImportReport import_ok(Target& t, const std::string& file, const ImportLimits& limits = {}) {
  return t.cache.import_from(file, tuning_row_problem, limits);
}

int64_t skipped(const ImportReport& r, const std::string& reason) {
  int64_t n = 0;
  for (const auto& [why, count] : r.skipped)
    if (contains(why, reason)) n += count;
  return n;
}

std::string dump(const ImportReport& r) {
  std::string s = fmt::format("taken {} {} {}", r.binaries.taken, r.measurements.taken, r.winners.taken);
  for (const auto& [why, n] : r.skipped) s += fmt::format("; {}: {}", why, n);
  return s;
}

}  // namespace

TEST_CASE("import: a plain export is taken whole, and a second import adds nothing") {
  TempDir dir;
  Export e(dir, "export.db");
  Target t(dir);
  const ImportReport first = import_ok(t, e.file);
  INFO(dump(first));
  CHECK(first.binaries.taken == 3);
  CHECK(first.measurements.taken == 6);
  CHECK(first.winners.taken == 2);
  CHECK(first.skipped.empty());
  const CacheSummary after_first = t.cache.summary();
  const ImportReport second = import_ok(t, e.file);
  CHECK(second.taken() == 0);
  CHECK(second.binaries.duplicates == 3);
  CHECK(second.measurements.duplicates == 6);
  CHECK(second.winners.duplicates == 2);
  const CacheSummary after_second = t.cache.summary();
  CHECK(after_second.binaries == after_first.binaries);
  CHECK(after_second.measurements == after_first.measurements);
  CHECK(after_second.winners == after_first.winners);
  // Rows repeated inside one file are taken once.
  RawDb(e.file).exec("INSERT INTO measurements(key_hash, key_text, family, template_hash, shape, token_bucket, device, "
                     "policy, config, status, median_ms, spread_ms, samples, detail, created) SELECT key_hash, key_text, "
                     "family, template_hash, shape, token_bucket, device, policy, config, status, median_ms, spread_ms, "
                     "samples, detail, created FROM measurements");
  Target fresh(dir, "fresh.db");
  const ImportReport doubled = import_ok(fresh, e.file);
  CHECK(doubled.measurements.read == 12);
  CHECK(doubled.measurements.taken == 6);
  CHECK(doubled.measurements.duplicates == 6);
}

TEST_CASE("import: a newer winner replaces the cache's, an older one does not") {
  TempDir dir;
  Export e(dir, "export.db");
  Target t(dir);
  Winner mine = e.winners[0];
  mine.config = "128x256x64_w8x1_s4_ws";
  t.cache.put_winner(mine);  // created now: newer than the export's
  RawDb(e.file).exec(fmt::format("UPDATE winners SET created = 1000 WHERE key_hash = '{}'", e.winners[1].key.hash()));
  Winner mine_old = e.winners[1];
  mine_old.config = "128x256x64_w8x1_s4_ws";
  t.cache.put_winner(mine_old);
  RawDb(t.path).exec(fmt::format("UPDATE winners SET created = 500 WHERE key_hash = '{}'", e.winners[1].key.hash()));
  const ImportReport r = import_ok(t, e.file);
  CHECK(r.winners.taken == 1);
  CHECK(r.winners.duplicates == 1);
  CHECK(t.cache.find_winner(e.winners[0].key)->config == "128x256x64_w8x1_s4_ws");  // ours is newer: kept
  CHECK(t.cache.find_winner(e.winners[1].key)->config == kTile);                    // theirs is newer: taken
}

TEST_CASE("import: files that are not plain exports are refused, and nothing is imported") {
  TempDir dir;
  Export e(dir, "export.db");
  Target t(dir);
  std::string words;
  std::function<void()> craft;
  ImportLimits limits;
  SUBCASE("binaries is a recursive view (used to fill the disk)") {
    craft = [&] {
      RawDb(e.file).exec("ALTER TABLE binaries RENAME TO b0; CREATE VIEW binaries AS WITH RECURSIVE r(i) AS (SELECT 1 "
                         "UNION ALL SELECT i + 1 FROM r) SELECT b0.* FROM r, b0;");
    };
    words = "binaries is a view";
  }
  SUBCASE("winners is a view of a table") {
    craft = [&] { RawDb(e.file).exec("ALTER TABLE winners RENAME TO w0; CREATE VIEW winners AS SELECT * FROM w0;"); };
    words = "winners is a view";
  }
  SUBCASE("measurements is a virtual table") {
    craft = [&] {
      RawDb(e.file).exec("DROP TABLE measurements; CREATE VIRTUAL TABLE measurements USING fts5(key_hash, key_text, "
                         "family, template_hash, shape, token_bucket, device, policy, config, status, median_ms, "
                         "spread_ms, samples, detail, created);");
    };
    words = "not a plain table";
  }
  SUBCASE("a generated column") {
    craft = [&] {
      RawDb(e.file).exec("ALTER TABLE winners RENAME TO w0; CREATE TABLE winners(key_hash TEXT, key_text TEXT, family "
                         "TEXT, template_hash TEXT, shape TEXT, token_bucket INTEGER, device TEXT, policy TEXT, config "
                         "TEXT, median_ms REAL, spread_ms REAL, default_ms REAL, created REAL GENERATED ALWAYS AS "
                         "(zeroblob(1000000)) VIRTUAL); INSERT INTO winners(key_hash, key_text, family, template_hash, shape, "
                         "token_bucket, device, policy, config, median_ms, spread_ms, default_ms) SELECT key_hash, key_text, family, "
                         "template_hash, shape, token_bucket, device, policy, config, median_ms, spread_ms, default_ms "
                         "FROM w0;");
    };
    words = "generated";
  }
  SUBCASE("a column missing") {
    craft = [&] { RawDb(e.file).exec("ALTER TABLE binaries DROP COLUMN log;"); };
    words = "binaries has no column log";
  }
  SUBCASE("another application") {
    craft = [&] { RawDb(e.file).exec("PRAGMA application_id = 7;"); };
    words = "application_id 0x7";
  }
  SUBCASE("a newer schema") {
    craft = [&] { RawDb(e.file).exec(fmt::format("PRAGMA user_version = {};", kCacheSchemaVersion + 1)); };
    words = "schema version";
  }
  SUBCASE("damaged pages") {
    craft = [&] {
      const auto size = fs::file_size(e.file);
      std::fstream f(e.file, std::ios::in | std::ios::out | std::ios::binary);
      const std::vector<char> noise = random_blob(size - 4096, 3);
      f.seekp(4096);
      f.write(noise.data(), std::streamsize(noise.size()));
    };
    words = "damaged";
  }
  SUBCASE("a FIFO") {
    craft = [&] {
      fs::remove(e.file);
      REQUIRE(mkfifo(e.file.c_str(), 0600) == 0);
    };
    words = "a FIFO";
  }
  SUBCASE("larger than the byte limit") {
    craft = [] {};
    limits.max_file_bytes = 4096;
    words = "over the import limit";
  }
  craft();
  // In a child with an alarm: a regression that loops or blocks fails instead of hanging.
  const std::string file = e.file, path = t.path;
  CHECK(run_in_child(
            [&]() -> std::string {
              KernelCache c(path);
              const std::string m = cache_error_of_quiet([&] { (void)c.import_from(file, tuning_row_problem, limits); });
              if (!contains(m, words) || !contains(m, file) || !contains(m, "nothing was imported")) return "message: " + m;
              return "";
            },
            false) == "");
  t.check_unchanged();
}

TEST_CASE("import: each bad row is left out with its reason, the good ones are taken") {
  TempDir dir;
  Export e(dir, "export.db");
  Target t(dir);
  {
    RawDb db(e.file);
    const std::string b0 = e.binaries[0].key_hash, b1 = e.binaries[1].key_hash, b2 = e.binaries[2].key_hash;
    db.exec(fmt::format("UPDATE binaries SET checksum = '0123456789abcdef' WHERE key_hash = '{}'", b0));
    db.exec(fmt::format("UPDATE binaries SET kernel_name = 'mb_x' || char(27) || '[31m' WHERE key_hash = '{}'", b1));
    db.exec(fmt::format("UPDATE binaries SET registers = 'many' WHERE key_hash = '{}'", b2));
    // Measurements: an infinity, a NULL time on an ok row, a tile that does not parse (with a
    // consistent key), a status outside the set.
    db.exec("UPDATE measurements SET median_ms = 9e999 WHERE id = 1");
    db.exec("UPDATE measurements SET median_ms = NULL WHERE id = 2");
    db.exec("UPDATE measurements SET config = 'big' || char(10) || 'tile' WHERE id = 4");
    db.exec("PRAGMA ignore_check_constraints = ON; UPDATE measurements SET status = 'great' WHERE id = 5");
    db.exec("DELETE FROM winners");
    TuningKey unknown = make_key(64);
    unknown.family = "warp_drive";
    insert_winner(db, unknown, kTile);
    insert_winner(db, make_key(128), "not_a_tile");
    insert_winner(db, make_key(256), kTile, "-1.0");
    TuningKey inconsistent = make_key(512);
    db.exec(fmt::format("INSERT INTO winners(key_hash, key_text, family, template_hash, shape, token_bucket, device, "
                        "policy, config, median_ms, spread_ms, default_ms, created) VALUES('{}', '{}', 'gate_up', '{}', "
                        "'other shape', 512, '{}', '{}', '{}', 1.0, 0.01, 1.5, 1700000000)",
                        inconsistent.hash(), inconsistent.text(), inconsistent.template_hash, inconsistent.device,
                        inconsistent.policy, kTile));
    TuningKey bucket = make_key(1000);  // not a power of two
    insert_winner(db, bucket, kTile);
    insert_winner(db, make_key(2048), kTile);  // the one good winner
  }
  const ImportReport r = import_ok(t, e.file);
  INFO(dump(r));
  CHECK(r.binaries.taken == 0);
  CHECK(skipped(r, "binaries.checksum: does not match the cubin") == 1);
  CHECK(skipped(r, "binaries.kernel_name: control") == 1);
  CHECK(skipped(r, "binaries.registers: wrong type") == 1);
  CHECK(r.measurements.taken == 2);
  CHECK(skipped(r, "measurements.median_ms: not finite") == 1);
  CHECK(skipped(r, "measurements.median_ms: missing for an ok measurement") == 1);
  CHECK(skipped(r, "measurements.config: control") == 1);
  CHECK(skipped(r, "measurements.status: unknown status") == 1);
  CHECK(r.winners.taken == 1);
  CHECK(skipped(r, "winners.config: unknown kernel family") == 1);
  CHECK(skipped(r, "winners.config: unparsable tile") == 1);
  CHECK(skipped(r, "winners.median_ms: out of range") == 1);
  CHECK(skipped(r, "winners.key_text: does not match") == 1);
  CHECK(skipped(r, "winners.token_bucket: not a power of two") == 1);
  CHECK(r.skipped_rows() == 3 + 4 + 5);
  CHECK(t.cache.all_winners().size() == 1);
  CHECK(t.cache.verify(false).problems.empty());
}

TEST_CASE("import: more cubin checks, caps on rows and bytes, tables a rowid walk cannot use") {
  TempDir dir;
  Export e(dir, "export.db");
  Target t(dir);
  SUBCASE("a cubin that is not an ELF file, with a checksum that fits it") {
    RawDb db(e.file);
    const std::string blob = "not an elf file at all";
    db.exec(fmt::format("UPDATE binaries SET cubin = CAST('{}' AS BLOB), checksum = '{}' WHERE key_hash = '{}'", blob,
                        key_hash(blob), e.binaries[0].key_hash));
    const ImportReport r = import_ok(t, e.file);
    CHECK(skipped(r, "binaries.cubin: not an ELF cubin") == 1);
    CHECK(r.binaries.taken == 2);
  }
  SUBCASE("a key hash that is not the key's") {
    RawDb(e.file).exec(fmt::format("UPDATE binaries SET key = key || 'x' WHERE key_hash = '{}'", e.binaries[1].key_hash));
    const ImportReport r = import_ok(t, e.file);
    CHECK(skipped(r, "binaries.key_hash: does not match the key") == 1);
  }
  SUBCASE("the row cap") {
    RawDb db(e.file);
    for (int i = 0; i < 4; ++i)
      db.exec("INSERT INTO measurements(key_hash, key_text, family, template_hash, shape, token_bucket, device, policy, "
              "config, status, median_ms, spread_ms, samples, detail, created) SELECT key_hash, key_text, family, "
              "template_hash, shape, token_bucket, device, policy, config, status, median_ms + id, spread_ms, samples, "
              "detail, created FROM measurements");
    ImportLimits limits;
    limits.max_rows = 50;
    const ImportReport r = import_ok(t, e.file, limits);
    CHECK(r.measurements.read == 96);
    CHECK(r.measurements.taken <= 50);
    CHECK(skipped(r, "measurements: over the limit of 50 rows") == 46);
  }
  SUBCASE("values over the byte limits") {
    ImportLimits limits;
    limits.max_blob_bytes = 1000;  // the cubins are 4000 bytes
    const ImportReport r = import_ok(t, e.file, limits);
    CHECK(r.binaries.taken == 0);
    CHECK(skipped(r, "binaries.cubin: too large") == 3);
    CHECK(r.measurements.taken == 6);
    limits.max_text_bytes = limits.max_log_bytes = 1000;  // now the limit SQLite enforces while reading
    Target other(dir, "other.db");
    const ImportReport r2 = import_ok(other, e.file, limits);
    CHECK(r2.binaries.taken == 0);
    CHECK(skipped(r2, "binaries: a value over the byte limit") == 3);
  }
  SUBCASE("a column named rowid, and a WITHOUT ROWID table") {
    RawDb db(e.file);
    db.exec("ALTER TABLE binaries ADD COLUMN rowid INTEGER DEFAULT 0");
    db.exec("ALTER TABLE winners RENAME TO w0; CREATE TABLE winners(key_hash TEXT PRIMARY KEY, key_text, family, "
            "template_hash, shape, token_bucket, device, policy, config, median_ms, spread_ms, default_ms, created) "
            "WITHOUT ROWID; INSERT INTO winners SELECT key_hash, key_text, family, template_hash, shape, token_bucket, "
            "device, policy, config, median_ms, spread_ms, default_ms, created FROM w0; DROP TABLE w0;");
    const ImportReport r = import_ok(t, e.file);
    INFO(dump(r));
    CHECK(r.binaries.taken == 3);
    CHECK(r.winners.taken == 2);
  }
  SUBCASE("a trigger in the file never runs") {
    RawDb(e.file).exec("CREATE TABLE log(x); CREATE TRIGGER t AFTER INSERT ON winners BEGIN INSERT INTO log VALUES (1); "
                       "END;");
    const ImportReport r = import_ok(t, e.file);
    CHECK(r.taken() == 11);
    CHECK(RawDb(e.file).integer("SELECT count(*) FROM log") == 0);
  }
  CHECK(t.cache.verify(false).problems.empty());
}

TEST_CASE("import: a winner that does not name a tile falls back to the default tile at load time") {
  TempDir dir;
  KernelCache c(dir.file("kernels.db"));
  LayerConfig layer;
  layer.shape = {8, 2, 256, 128};
  const LoadOptions options{4096, "policy", {}};
  const std::string device = "test device";
  LoadReport defaults;
  const std::vector<KernelSpec> plain = choose_tiles(layer, Arch::sm_90a, device, nullptr, options, defaults);
  // A winner row as a damaged or hand-made cache may hold it (put_winner does not check).
  const TuningKey up = tuning_key(KernelFamily::gate_up, layer, 4096, device, "policy");
  Winner bad{up, "garbage\x1b[31m", 1.0, 0.01, 2.0, 0};
  c.put_winner(bad);
  const TuningKey down = tuning_key(KernelFamily::down_proj, layer, 4096, device, "policy");
  const TileConfig legal = TileConfig::parse("128x128x64_w8x1_s3_wgmma");
  c.put_winner(Winner{down, legal.to_string(), 1.0, 0.01, 2.0, 0});
  LoadReport r;
  std::vector<KernelSpec> specs;
  CHECK_NOTHROW(specs = choose_tiles(layer, Arch::sm_90a, device, &c, options, r));
  REQUIRE(specs.size() == plain.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].family == KernelFamily::gate_up) CHECK(specs[i].tile == plain[i].tile);
    if (specs[i].family == KernelFamily::down_proj) {
      CHECK(specs[i].tile == legal);
      CHECK(r.kernels[i].tile_source == TileSource::tuned_exact);
    }
  }
  REQUIRE(r.warnings.size() == 1);
  CHECK(contains(r.warnings[0], "gate_up"));
  CHECK(contains(r.warnings[0], "does not name a tile"));
  CHECK_FALSE(contains(r.warnings[0], "\x1b"));
  CHECK(contains(r.summary(), "warning: the cache's winner for gate_up"));
}

namespace {

// The fuzz: one random change to an export (its schema, its rows, or its bytes).
struct Fuzzer {
  std::mt19937_64 rng;
  explicit Fuzzer(uint64_t seed) : rng(seed) {}
  int64_t pick(int64_t n) { return int64_t(rng() % uint64_t(n)); }

  std::string random_text() {
    static const char* pieces[] = {"", "x", "gate_up", "up_proj", "warp_drive", kTile, "not_a_tile", "mb_gate_up", "sm_90a",
                                   "0123456789abcdef", "ok", "illegal", "\x1b[2J", "\x07", "a\nb", "\xc2\x9b", "\xff\xfe",
                                   "'); DROP TABLE binaries; --", "%s%n", "1e999"};
    std::string s = pieces[pick(std::size(pieces))];
    if (pick(4) == 0) s += std::string(size_t(pick(3000)), char('a' + pick(26)));
    if (pick(4) == 0) s += char(pick(256));
    return s;
  }
  // A literal SQL value of any storage class.
  std::string random_value() {
    switch (pick(8)) {
      case 0: return "NULL";
      case 1: {
        static const char* ints[] = {"0", "-1", "1", "255", "256", "1024", "2147483648", "9223372036854775807",
                                     "-9223372036854775808", "1000"};
        return ints[pick(std::size(ints))];
      }
      case 2: {
        static const char* reals[] = {"9e999", "-9e999", "0.0", "-0.5", "1e300", "1.5", "1700000000.0", "1e12"};
        return reals[pick(std::size(reals))];
      }
      case 3: return fmt::format("randomblob({})", pick(5000));
      case 4: return "X'7F454C46'";
      default: {
        std::string t = random_text(), q = "'";
        for (char c : t) q += c == '\'' ? std::string("''") : c == 0 ? std::string("") : std::string(1, c);
        return q + "'";
      }
    }
  }
  std::string random_table() {
    static const char* tables[] = {"binaries", "measurements", "winners"};
    return tables[pick(3)];
  }
  std::string random_column(const std::string& table) {
    static const std::vector<std::string> b = {"key_hash", "key", "kernel_name", "arch", "nvrtc_version", "cubin",
                                               "checksum", "registers", "spill_bytes", "static_smem", "dynamic_smem",
                                               "threads", "log", "created", "last_used"};
    static const std::vector<std::string> m = {"key_hash", "key_text", "family", "template_hash", "shape",
                                               "token_bucket", "device", "policy", "config", "status", "median_ms",
                                               "spread_ms", "samples", "detail", "created"};
    static const std::vector<std::string> w = {"key_hash", "key_text", "family", "template_hash", "shape",
                                               "token_bucket", "device", "policy", "config", "median_ms", "spread_ms",
                                               "default_ms", "created"};
    const auto& cols = table == "binaries" ? b : table == "measurements" ? m : w;
    return cols[size_t(pick(int64_t(cols.size())))];
  }

  // SQL that changes the file; may fail (then the round goes on with the file as it is).
  std::string sql_mutation() {
    const std::string t = random_table();
    switch (pick(12)) {
      case 0:
      case 1:
      case 2:
      case 3: return fmt::format("UPDATE {} SET {} = {} WHERE rowid = {}", t, random_column(t), random_value(), 1 + pick(6));
      case 4: return fmt::format("DELETE FROM {} WHERE rowid = {}", t, 1 + pick(6));
      case 5: return fmt::format("INSERT INTO {0} SELECT * FROM {0} WHERE rowid = {1}", t, 1 + pick(6));
      case 6: return fmt::format("ALTER TABLE {0} RENAME TO old_{0}; CREATE VIEW {0} AS SELECT * FROM old_{0}", t);
      case 7: return fmt::format("ALTER TABLE {} DROP COLUMN {}", t, random_column(t));
      case 8: return fmt::format("ALTER TABLE {} ADD COLUMN extra_{} DEFAULT {}", t, pick(100), random_value());
      case 9: return fmt::format("PRAGMA user_version = {}", pick(4));
      case 10: return fmt::format("PRAGMA application_id = {}", pick(3) ? 0x4D4F4542 : pick(1000));
      default: {
        std::string rows;
        for (int i = 0; i < 200; ++i) rows += fmt::format("{}({})", i ? "," : "", random_value());
        return fmt::format("CREATE TABLE IF NOT EXISTS junk(x); INSERT INTO junk VALUES {}", rows);
      }
    }
  }
  void byte_mutation(const std::string& file) {
    const auto size = int64_t(fs::file_size(file));
    if (pick(5) == 0) {
      fs::resize_file(file, uintmax_t(pick(size)));
      return;
    }
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    for (int64_t i = 0, n = 1 + pick(20); i < n; ++i) {
      f.seekp(pick(size));
      const char c = char(pick(256));
      f.write(&c, 1);
    }
  }
};

int fuzz_rounds() {
  const char* v = std::getenv("MOEBLAZE_FUZZ_ROUNDS");
  return v && *v ? std::max(1, std::atoi(v)) : 150;
}

uint64_t fuzz_seed() {
  if (const char* v = std::getenv("MOEBLAZE_FUZZ_SEED"); v && *v) return std::strtoull(v, nullptr, 10);
  return std::random_device{}();
}

// What every row a successful import wrote must satisfy, checked with plain SQL behind the
// cache's back ("" when all hold).
std::string imported_rows_problem(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) return "cannot reopen the cache";
  const char* checks[] = {
      "SELECT count(*) FROM winners WHERE typeof(median_ms) NOT IN ('real', 'integer') OR median_ms < 0 OR median_ms > 1e9",
      "SELECT count(*) FROM measurements WHERE median_ms IS NOT NULL AND (median_ms < 0 OR median_ms > 1e9)",
      "SELECT count(*) FROM binaries WHERE substr(cubin, 1, 4) <> X'7F454C46' OR typeof(registers) <> 'integer'",
      "SELECT count(*) FROM winners WHERE config GLOB '*[^ -~]*' OR family GLOB '*[^a-z_]*' OR device GLOB '*[^ -~]*'",
      "SELECT count(*) FROM binaries WHERE kernel_name NOT GLOB 'mb_*' OR key GLOB '*[^ -~]*'",
      "SELECT count(*) FROM winners WHERE token_bucket <= 0 OR (token_bucket & (token_bucket - 1)) <> 0"};
  std::string out;
  for (const char* sql : checks) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK) {
      out = std::string("cannot check: ") + sql;
      break;
    }
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_int64(s, 0) != 0) out = std::string("a row breaks: ") + sql;
    sqlite3_finalize(s);
    if (!out.empty()) break;
  }
  sqlite3_close(db);
  return out;
}

}  // namespace

TEST_CASE("import: fuzz (crafted schemas, rows and bytes) never crashes, hangs or lets a bad row in") {
  const uint64_t seed = fuzz_seed();
  const int rounds = fuzz_rounds();
  std::printf("import fuzz: seed %llu, %d rounds (MOEBLAZE_FUZZ_SEED=%llu repeats it)\n",
              static_cast<unsigned long long>(seed), rounds, static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  INFO("MOEBLAZE_FUZZ_SEED=" << seed);
  TempDir dir;
  Export base(dir, "base.db");
  Fuzzer fz(seed);
  int refused = 0, imported = 0;
  for (int round = 0; round < rounds; ++round) {
    const std::string file = dir.file(fmt::format("fuzz-{}.db", round));
    fs::copy_file(base.file, file);
    {
      sqlite3* db = nullptr;
      REQUIRE(sqlite3_open(file.c_str(), &db) == SQLITE_OK);
      for (int64_t i = 0, n = 1 + fz.pick(5); i < n; ++i)
        sqlite3_exec(db, fz.sql_mutation().c_str(), nullptr, nullptr, nullptr);  // a failing change is fine
      sqlite3_close(db);
    }
    if (fz.pick(3) == 0) fz.byte_mutation(file);
    const std::string target = dir.file(fmt::format("target-{}.db", round));
    const std::string outcome = run_in_child(
        [&]() -> std::string {
          KernelCache c(target);
          try {
            const ImportReport r = c.import_from(file, tuning_row_problem);
            if (r.taken() > 3 + 6 + 2 + 200) return "took more rows than the file had";
          } catch (const CacheError&) {
            return "refused";
          }
          if (const VerifyReport v = c.verify(false); !v.problems.empty()) return "cache damaged: " + v.problems[0];
          for (const Winner& w : c.all_winners()) (void)TileConfig::parse(w.config);
          return imported_rows_problem(target);
        },
        false);
    INFO("round " << round);
    if (outcome == "refused") ++refused;
    else if (outcome.empty()) ++imported;
    else FAIL_CHECK(outcome);
  }
  std::printf("import fuzz: %d imported, %d refused\n", imported, refused);
  CHECK(imported > 0);  // the fuzz reaches the row checks, not only the file checks
  CHECK(refused > 0);
}

TEST_CASE("load: a read-only or failing cache costs compile time, never the load") {
  TempDir dir;
  const std::string path = dir.file("kernels.db");
  { KernelCache create(path); }
  LayerConfig layer;
  layer.shape = {8, 2, 64, 64};
  std::vector<KernelSpec> specs = layer_kernel_specs(layer, Arch::sm_90a, 0);
  specs.resize(1);  // one small kernel: NVRTC needs no GPU
  {
    KernelCache ro(path, true);
    LoadReport r;
    std::vector<BuiltKernel> built;
    CHECK_NOTHROW(built = build_with_cache(specs, &ro, &r));
    CHECK(built.size() == 1);
    CHECK(r.compiled == 1);
    CHECK(r.warnings.empty());
  }
  CHECK(RawDb(path).integer("SELECT count(*) FROM binaries") == 0);  // read-only: nothing stored
  {
    KernelCache rw(path);
    LoadReport r;
    build_with_cache(specs, &rw, &r);
    CHECK(r.compiled == 1);
    LoadReport again;
    build_with_cache(specs, &rw, &again);
    CHECK(again.cache_hits == 1);
  }
  // Every page after the header damaged while a process has the cache open.
  KernelCache open(path);
  {
    const auto size = fs::file_size(path);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const std::vector<char> noise = random_blob(size - 4096, 11);
    f.seekp(4096);
    f.write(noise.data(), std::streamsize(noise.size()));
  }
  // Another process's write makes this one drop its page cache and read the damaged pages.
  RawDb(path).exec("CREATE TABLE other_process(x)");
  LoadReport r;
  std::vector<BuiltKernel> built;
  CHECK_NOTHROW(built = build_with_cache(specs, &open, &r));
  CHECK(built.size() == 1);
  CHECK(r.compiled == 1);
  REQUIRE(r.warnings.size() == 1);  // said once why the cache did not serve
  CHECK(contains(r.warnings[0], "compiling without the cache"));
}
