// A cache other users read, or root repairs: a reader that does not own the file leaves
// nothing beside it, a salvaged file keeps its owner and mode; and paths that would be
// followed somewhere unexpected (a symbolic link to nothing) are refused. Also: a cubin
// stored as TEXT is really deleted by verify --fix.
#include "cache_test_util.hpp"

using namespace cache_test;

namespace {

constexpr uid_t kNobody = 65534;

void make_cache(const std::string& path) {
  KernelCache c(path);
  for (int i = 0; i < 4; ++i) c.put_binary(make_binary(fmt::format("mb_share_{}", i), 10000, unsigned(i)));
  std::vector<Measurement> ms;
  for (int i = 0; i < 40; ++i) ms.push_back(make_measurement(make_key(), "128x128x64_w2x4_s3", "ok", 1.0 + i));
  c.add_measurements(ms);
}

bool beside(const std::string& path, const char* suffix) { return fs::exists(path + suffix); }

}  // namespace

TEST_CASE("cache sharing: a reader that does not own the file leaves nothing beside it") {
  if (getuid() != 0) {
    MESSAGE("needs root (another user is simulated by changing owners)");
    return;
  }
  TempDir dir;
  fs::permissions(dir.path, fs::perms::all);  // a shared folder everyone may write
  const std::string path = dir.file("shared.db");
  make_cache(path);
  REQUIRE_FALSE(beside(path, "-wal"));
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);

  SUBCASE("another user reads root's cache") {
    CHECK(run_in_child([&]() -> std::string {
            for (bool read_only : {true, false}) {  // asked for, and fallen back to (the file is 0644)
              KernelCache c(path, read_only);
              if (c.summary().binaries != 4) return "rows not read";
              if (!c.find_binary(make_binary("mb_share_1", 10000, 1).key_hash, make_binary("mb_share_1", 10000, 1).key))
                return "binary not read";
            }
            return "";
          }) == "");
  }
  SUBCASE("root reads another user's cache") {
    REQUIRE(chown(path.c_str(), kNobody, kNobody) == 0);
    KernelCache c(path, true);
    CHECK(c.summary().binaries == 4);
  }
  CHECK_FALSE(beside(path, "-wal"));
  CHECK_FALSE(beside(path, "-shm"));
  // The owner can still write its cache.
  REQUIRE(chown(path.c_str(), 0, 0) == 0);
  KernelCache owner(path);
  CHECK(owner.writable());
  owner.put_binary(make_binary("mb_owner", 1000, 40));
  CHECK(owner.gc(0) == 5);
}

TEST_CASE("cache sharing: verify --fix keeps the owner and mode of the file it salvages") {
  if (getuid() != 0) {
    MESSAGE("needs root (to salvage another user's file)");
    return;
  }
  TempDir dir;
  const std::string path = dir.file("user.db");
  make_cache(path);
  const int64_t page = RawDb(path).integer("SELECT rootpage FROM sqlite_master WHERE name = 'measurements'");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp((page - 1) * 4096);
    const std::vector<char> noise = random_blob(4096, 3);
    f.write(noise.data(), std::streamsize(noise.size()));
  }
  REQUIRE(chown(path.c_str(), kNobody, kNobody) == 0);
  REQUIRE(chmod(path.c_str(), 0640) == 0);
  REQUIRE_THROWS_AS(KernelCache{path}, CacheDamaged);
  const SalvageReport r = KernelCache::salvage(path);
  CHECK(r.copied.binaries.taken == 4);
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK(st.st_uid == kNobody);
  CHECK(st.st_gid == kNobody);
  CHECK((st.st_mode & 07777) == 0640);
  CHECK(run_in_child([&]() -> std::string { return KernelCache(path).summary().binaries == 4 ? "" : "not readable"; }) ==
        "");
}

TEST_CASE("cache sharing: a symbolic link to nothing is refused as the cache and as an export target") {
  TempDir dir;
  const std::string missing = dir.file("missing.db"), link = dir.file("link.db");
  fs::create_symlink(missing, link);
  for (bool read_only : {false, true}) {
    const std::string e = cache_error_of([&] { KernelCache c(link, read_only); });
    CHECK(contains(e, link));
    CHECK(contains(e, "symbolic link"));
  }
  CHECK_FALSE(fs::exists(missing));

  const std::string k = dir.file("k.db"), target = dir.file("export-target.db"), export_link = dir.file("export.db");
  make_cache(k);
  fs::create_symlink(target, export_link);
  const std::string e = cache_error_of([&] { KernelCache(k).export_to(export_link); });
  CHECK(contains(e, "symbolic link"));
  CHECK_FALSE(fs::exists(target));
  // A link to a cache that exists is followed as before.
  const std::string good_link = dir.file("good-link.db");
  fs::create_symlink(k, good_link);
  CHECK(KernelCache(good_link).summary().binaries == 4);
}

TEST_CASE("cache: verify --fix deletes a cubin stored as TEXT, and says how many it deleted") {
  TempDir dir;
  const std::string path = dir.file("k.db");
  make_cache(path);
  RawDb(path).exec("UPDATE binaries SET cubin = CAST(cubin AS TEXT) WHERE kernel_name = 'mb_share_2'");
  {
    KernelCache c(path);
    const VerifyReport r = c.verify(false);
    CHECK(r.bad_checksums == 1);
    CHECK(r.deleted == 0);
    REQUIRE(r.problems.size() == 1);
    CHECK(contains(r.problems[0], "stored as text"));
    const VerifyReport fixed = c.verify(true);
    CHECK(fixed.deleted == 1);
  }
  CHECK(RawDb(path).integer("SELECT count(*) FROM binaries WHERE kernel_name = 'mb_share_2'") == 0);
  CHECK(KernelCache(path).verify(false).bad_checksums == 0);
}
