// Whose -wal is it (cache/kernel_cache_wal.cpp): a -wal beside the cache that no process has
// open is folded in only when it is the cache's own (a crash's); another file's, an older one,
// or one written by something that does not count its writes is refused and left as it is,
// until `verify --fix` sets it aside or `--take-wal` folds it in. A live -wal is never judged.
#include <sys/wait.h>

#include "cache_test_util.hpp"

using namespace cache_test;

namespace {

// A process that writes to the cache and dies before closing it: its writes stay in the -wal.
template <class F>
void crash_after(const std::string& path, F&& writes) {
  CHECK(run_in_child(
            [&]() -> std::string {
              KernelCache c(path);
              writes(c);
              _exit(0);
            },
            false) == "");
}

// The same with a plain SQLite connection, which does not count its writes.
void crash_after_sql(const std::string& path, const std::string& sql) {
  CHECK(run_in_child(
            [&]() -> std::string {
              sqlite3* db = nullptr;
              if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return "open";
              if (sqlite3_exec(db, ("PRAGMA wal_autocheckpoint = 0; " + sql).c_str(), nullptr, nullptr, nullptr) !=
                  SQLITE_OK)
                return sqlite3_errmsg(db);
              _exit(0);
            },
            false) == "");
}

std::string file_id(const std::string& path) { return RawDb(path).text("SELECT id FROM cache_file"); }

// A cache with `n` binaries, closed (no -wal).
void make_cache(const std::string& path, int n, unsigned seed) {
  KernelCache c(path);
  for (int i = 0; i < n; ++i) c.put_binary(make_binary(fmt::format("mb_k{}_{}", seed, i), 20000, seed + i));
}

int64_t binaries(const std::string& path) { return KernelCache(path).summary().binaries; }

std::string refusal_of(const std::string& path) {
  try {
    KernelCache c(path);
  } catch (const CacheWalRefused& e) {
    CHECK(e.wal == path + "-wal");
    CHECK(contains(e.what(), "verify --fix"));
    return e.reason;
  }
  return "accepted";
}

}  // namespace

TEST_CASE("cache wal: another cache's -wal copied beside it is refused and the cache's rows stay") {
  TempDir dir;
  const std::string k = dir.file("k.db"), other = dir.file("other.db");
  make_cache(k, 3, 1);
  crash_after(other, [](KernelCache& c) { c.put_binary(make_binary("mb_other", 20000, 9)); });
  REQUIRE(fs::exists(other + "-wal"));
  fs::copy_file(other + "-wal", k + "-wal");  // the reproduction: cp other.db-wal k.db-wal
  const std::string file_before = read_file(k), wal_before = read_file(k + "-wal");
  const std::string k_id = [&] {
    sqlite3* db = nullptr;  // the file alone, its -wal not read
    REQUIRE(sqlite3_open_v2(("file:" + k + "?immutable=1").c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI,
                            nullptr) == SQLITE_OK);
    sqlite3_stmt* s = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, "SELECT id FROM cache_file", -1, &s, nullptr) == SQLITE_OK);
    REQUIRE(sqlite3_step(s) == SQLITE_ROW);
    std::string id = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    sqlite3_close(db);
    return id;
  }();
  for (bool read_only : {false, true}) {
    CAPTURE(read_only);
    const std::string e = cache_error_of([&] { KernelCache c(k, read_only); });
    CHECK(contains(e, "not this cache's own: it belongs to another file"));
    CHECK(contains(e, k_id));
    CHECK(contains(e, "cache export"));
  }
  CHECK(read_file(k) == file_before);
  CHECK(read_file(k + "-wal") == wal_before);

  SUBCASE("verify --fix sets it aside, kept byte for byte") {
    const std::string moved = KernelCache::set_aside_refused_wal(k);
    REQUIRE(!moved.empty());
    CHECK(contains(moved, k + "-wal.refused-"));
    CHECK(read_file(moved) == wal_before);
    CHECK_FALSE(fs::exists(k + "-wal"));
    CHECK(binaries(k) == 3);
    CHECK(KernelCache::set_aside_refused_wal(k) == "");  // nothing left to move
  }
  SUBCASE("--take-wal folds it in, and the file gets a fresh id") {
    const std::string other_id = file_id(other);
    {
      KernelCache taken(k, false, true);
      CHECK(taken.summary().binaries == 1);  // what the -wal holds: the other cache
    }
    CHECK_FALSE(fs::exists(k + "-wal"));
    const std::string id = file_id(k);
    CHECK(id.size() == 32);
    CHECK(id != other_id);
    CHECK(id != k_id);
  }
}

TEST_CASE("cache wal: a crash's -wal is the cache's own: SQLite's recovery keeps its writes") {
  TempDir dir;
  const std::string k = dir.file("k.db");
  make_cache(k, 3, 1);
  crash_after(k, [](KernelCache& c) {
    c.put_binary(make_binary("mb_late_1", 20000, 21));
    c.put_binary(make_binary("mb_late_2", 20000, 22));
  });
  REQUIRE(fs::file_size(k + "-wal") > 20000);
  CHECK(refusal_of(k) == "accepted");
  CHECK(binaries(k) == 5);
  CHECK_FALSE(fs::exists(k + "-wal"));  // folded in at the last close
  // Eight processes opening the same leftover at once all take it.
  crash_after(k, [](KernelCache& c) { c.put_binary(make_binary("mb_late_3", 20000, 23)); });
  std::vector<pid_t> kids;
  for (int i = 0; i < 8; ++i) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(60);
      try {
        _exit(KernelCache(k).summary().binaries == 6 ? 0 : 1);
      } catch (...) {
        _exit(2);
      }
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  CHECK(binaries(k) == 6);
}

TEST_CASE("cache wal: eight processes opening another file's -wal at once all refuse it") {
  TempDir dir;
  const std::string k = dir.file("k.db"), other = dir.file("other.db");
  make_cache(k, 3, 1);
  crash_after(other, [](KernelCache& c) { c.put_binary(make_binary("mb_other", 20000, 9)); });
  fs::copy_file(other + "-wal", k + "-wal");
  const std::string before = read_file(k);
  std::vector<pid_t> kids;
  for (int i = 0; i < 8; ++i) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(60);
      try {
        KernelCache c(k);
        _exit(1);
      } catch (const CacheWalRefused&) {
        _exit(0);
      } catch (...) {
        _exit(2);
      }
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  CHECK(read_file(k) == before);
  CHECK(fs::exists(k + "-wal"));
}

TEST_CASE("cache wal: a -wal older than the file is refused, a VACUUM included") {
  TempDir dir;
  const std::string k = dir.file("k.db"), saved = dir.file("saved-wal");
  make_cache(k, 3, 1);
  SUBCASE("more writes since") {
    crash_after(k, [](KernelCache& c) { c.put_binary(make_binary("mb_late", 20000, 21)); });
    fs::copy_file(k + "-wal", saved);
    KernelCache c(k);  // takes the crash's -wal, then writes on
    c.put_binary(make_binary("mb_later", 20000, 31));
  }
  SUBCASE("only a gc's VACUUM since") {
    // A copy of the -wal while a process has the cache open, then that process's gc, which
    // deletes nothing and vacuums free pages away: the copy's pages no longer fit the file.
    KernelCache c(k);
    RawDb(k).exec("DELETE FROM binaries WHERE rowid = 1");  // free pages, no counted write
    fs::copy_file(k + "-wal", saved);
    CHECK(c.gc(int64_t(1) << 40) == 0);
  }
  CHECK_FALSE(fs::exists(k + "-wal"));
  fs::copy_file(saved, k + "-wal");
  const std::string before = read_file(k);
  CHECK(contains(refusal_of(k), "it is older than the file"));
  CHECK(read_file(k) == before);
}

TEST_CASE("cache wal: a -wal whose writes are not counted, or beside a file without an id, is refused") {
  TempDir dir;
  const std::string k = dir.file("k.db");
  make_cache(k, 3, 1);
  SUBCASE("written by a program that does not count its writes") {
    crash_after_sql(k, "DELETE FROM binaries;");
    CHECK(contains(refusal_of(k), "not written by moeblaze for this file"));
  }
  SUBCASE("beside a file from before file ids") {
    RawDb(k).exec("DROP TABLE cache_file");
    crash_after_sql(k, "DELETE FROM binaries;");
    CHECK(contains(refusal_of(k), "no file id"));
    // Set aside, the file is read as it was and gets an id.
    REQUIRE(!KernelCache::set_aside_refused_wal(k).empty());
    CHECK(binaries(k) == 3);
    CHECK(file_id(k).size() == 32);
  }
}

TEST_CASE("cache wal: a -wal that changes nothing, a fresh file's, and a live one are left to SQLite") {
  TempDir dir;
  const std::string k = dir.file("k.db");
  make_cache(k, 3, 1);
  SUBCASE("frames that do not validate") {
    write_file(k + "-wal", std::string(64 << 10, '\x5a'));
    CHECK(refusal_of(k) == "accepted");
    CHECK(binaries(k) == 3);
  }
  SUBCASE("a fresh cache whose first writes are all in the -wal") {
    const std::string fresh = dir.file("fresh.db");
    crash_after(fresh, [](KernelCache& c) { c.put_binary(make_binary("mb_first", 20000, 5)); });
    CHECK(refusal_of(fresh) == "accepted");
    CHECK(binaries(fresh) == 1);
  }
  SUBCASE("a -wal another process has open") {
    int go[2], ready[2];
    REQUIRE(pipe(go) == 0);
    REQUIRE(pipe(ready) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(60);
      KernelCache c(k);
      c.put_binary(make_binary("mb_live", 20000, 7));
      char b = 1;
      if (write(ready[1], &b, 1) != 1 || read(go[0], &b, 1) != 1) _exit(2);
      _exit(0);  // still holding it
    }
    char b = 0;
    REQUIRE(read(ready[0], &b, 1) == 1);
    CHECK(refusal_of(k) == "accepted");
    CHECK(KernelCache(k).summary().binaries == 4);
    REQUIRE(write(go[1], &b, 1) == 1);
    waitpid(pid, nullptr, 0);
    for (int fd : {go[0], go[1], ready[0], ready[1]}) close(fd);
  }
}

TEST_CASE("cache wal: an export carries no file id, so a cache made from it gets its own") {
  TempDir dir;
  const std::string k = dir.file("k.db"), e = dir.file("export.db");
  make_cache(k, 2, 1);
  KernelCache(k).export_to(e);
  CHECK(RawDb(e).integer("SELECT count(*) FROM sqlite_master WHERE name = 'cache_file'") == 0);
  CHECK(binaries(e) == 2);  // used as a cache
  CHECK(file_id(e).size() == 32);
  CHECK(file_id(e) != file_id(k));
}
