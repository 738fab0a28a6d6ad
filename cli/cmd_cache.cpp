// `moeblaze cache list|show|export|import|verify|gc`.
#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <nlohmann/json.hpp>

#include "cache/kernel_cache.hpp"
#include "cli/commands.hpp"
#include "cli/json_report.hpp"
#include "core/checked.hpp"
#include "core/errors.hpp"
#include "runtime/cache_keys.hpp"

namespace moeblaze::cli {

std::string cache_path_option(const std::string& db);
void print_notices(const KernelCache& cache);

namespace {

nlohmann::json table_json(const TableCopy& t) {
  return {{"read", t.read},           {"taken", t.taken},
          {"duplicates", t.duplicates}, {"unreadable", t.unreadable},
          {"damaged_ranges", t.damaged_ranges}};
}

nlohmann::json import_json(const ImportReport& r) {
  return {{"binaries", table_json(r.binaries)},
          {"measurements", table_json(r.measurements)},
          {"winners", table_json(r.winners)},
          {"taken", r.taken()},
          {"skipped", r.skipped},
          {"notes", r.notes}};
}

void print_import(const ImportReport& r, const std::string& verb, const std::string& where) {
  fmt::print("{} {} rows{} ({} binaries, {} measurements, {} winners)", verb, r.taken(), where, r.binaries.taken,
             r.measurements.taken, r.winners.taken);
  const int64_t dup = r.binaries.duplicates + r.measurements.duplicates + r.winners.duplicates;
  fmt::print("; {} already present\n", dup);
  if (const int64_t skipped = r.skipped_rows(); skipped > 0) {
    fmt::print("left out {} rows that failed a check:\n", skipped);
    for (const auto& [reason, n] : r.skipped) fmt::print("  {:>8}  {}\n", n, reason);
  }
  for (const auto& [name, t] : {std::pair{"binaries", &r.binaries}, std::pair{"measurements", &r.measurements},
                                std::pair{"winners", &r.winners}})
    if (t->unreadable || t->damaged_ranges)
      fmt::print("lost from {}: {} unreadable rows{}\n", name, t->unreadable,
                 t->damaged_ranges ? fmt::format(", and every row in {} damaged runs of ids (their count is unknown)",
                                                 t->damaged_ranges)
                                   : "");
  for (const auto& n : r.notes) fmt::print("lost: {}\n", n);
}

// `cache verify --fix` on a file whose pages are damaged: every readable row into a fresh
// file, the original kept beside it.
int salvage(const std::string& path, bool json) {
  const SalvageReport s = KernelCache::salvage(path, tuning_row_problem);
  if (json) {
    emit_json({{"salvaged", import_json(s.copied)}, {"damaged_copy", s.damaged_copy}, {"problems", s.problems}});
    return 0;
  }
  fmt::print("{} was damaged; its readable rows are now a fresh cache there\n", path);
  print_import(s.copied, "saved", "");
  fmt::print("the damaged original is kept as {} (delete it yourself once the salvaged cache serves you)\n",
             s.damaged_copy);
  return 0;
}

}  // namespace

Command cache_command() {
  struct State {
    CLI::App* app = nullptr;
    CLI::App *list = nullptr, *show = nullptr, *exp = nullptr, *imp = nullptr, *verify = nullptr, *gc = nullptr;
    std::string db, file;
    double max_mb = 1024;
    bool json = false, fix = false, take_wal = false;
  };
  auto st = std::make_shared<State>();
  Command c;
  c.add = [st](CLI::App& root) {
    st->app = root.add_subcommand("cache", "inspect and manage the kernel cache");
    st->app->require_subcommand(1);
    st->app->add_option("--db", st->db, "cache file (default: $MOEBLAZE_CACHE or ~/.cache/moeblaze/kernels.db)");
    st->app->add_flag("--json", st->json, "machine-readable output");
    st->list = st->app->add_subcommand("list", "tuned winners (reads only)");
    st->show = st->app->add_subcommand("show", "summary: rows, sizes, schema, notices (reads only)");
    st->exp = st->app->add_subcommand("export", "write a portable copy (a team can ship tuned results)");
    st->exp->add_option("file", st->file, "file to create")->required();
    st->imp = st->app->add_subcommand(
        "import",
        "take the rows of an exported file: every row is checked and bad ones are left out with a reason; rows "
        "already present are not added again. Importing a file means running its GPU code: import only files you "
        "trust (README \"Trust\")");
    st->imp->add_option("file", st->file, "exported file")->required();
    st->verify = st->app->add_subcommand(
        "verify", "integrity check and blob checksums; exit 1 naming each problem (the file is never changed without --fix)");
    st->verify->add_flag("--fix",
                         st->fix,
                         "delete binaries whose checksum fails (they are rebuilt); a file with damaged pages is "
                         "salvaged instead: every readable row goes into a fresh file at the same path and the "
                         "damaged original is kept beside it as PATH.damaged-<time> (run it while no other moeblaze "
                         "process uses the cache). A -wal beside the file that is not its own (another file's, or "
                         "older than the file) is set aside as PATH-wal.refused-<time>, kept, never deleted");
    st->verify->add_flag("--take-wal", st->take_wal,
                         "fold in a -wal beside the file that the cache refused as not its own: only when you know it "
                         "is this cache's (the file then gets a fresh file id)");
    st->gc = st->app->add_subcommand(
        "gc",
        "delete cached binaries (compiled kernels, rebuilt on demand) until they take at most --max-mb: binaries "
        "no tuned winner names first, least recently used first. Tuning results are never deleted");
    st->gc->add_option("--max-mb", st->max_mb, "cap in MiB (0 .. 1048576); a cap at or above the current size deletes nothing")
        ->capture_default_str();
    for (CLI::App* s : {st->list, st->show, st->exp, st->imp, st->verify, st->gc}) {
      s->add_option("--db", st->db, "cache file");
      s->add_flag("--json", st->json, "machine-readable output");
    }
  };
  c.selected = [st] { return st->app->parsed(); };
  c.run = [st] {
    const std::string path = cache_path_option(st->db);
    // Checked before the cache is opened: a bad cap changes nothing.
    int64_t max_bytes = 0;
    if (st->gc->parsed()) {
      require_finite(st->max_mb, 0, kMaxCacheMiB, "--max-mb");
      max_bytes = static_cast<int64_t>(std::floor(st->max_mb * 1048576.0));
    }
    const bool take_wal = st->verify->parsed() && st->take_wal;
    const bool reads_only = st->list->parsed() || st->show->parsed() || st->exp->parsed() ||
                            (st->verify->parsed() && !st->fix && !take_wal);
    std::optional<KernelCache> opened;
    std::string wal_set_aside;
    try {
      try {
        opened.emplace(path, reads_only, take_wal);
      } catch (const CacheWalRefused& e) {
        if (!st->verify->parsed() || !st->fix) throw;
        wal_set_aside = KernelCache::set_aside_refused_wal(path);
        if (!st->json)
          fmt::print("the -wal beside {} was not its own ({}): set aside as {} (kept; delete it yourself once sure)\n",
                     path, e.reason, wal_set_aside.empty() ? "(already gone)" : wal_set_aside);
        opened.emplace(path, reads_only);
      }
    } catch (const CacheDamaged& e) {
      if (!st->verify->parsed()) throw;
      if (st->fix) return salvage(path, st->json);
      if (st->json)
        emit_json({{"verify", {{"integrity_ok", false}, {"problems", e.problems}}}});
      else {
        fmt::print("integrity FAILED: {} is damaged\n", path);
        for (const auto& p : e.problems) fmt::print("  {}\n", p);
        fmt::print("the file is left as it is; `moeblaze cache verify --fix --db {}` copies every readable row into a "
                   "fresh file and keeps the damaged one beside it\n",
                   path);
      }
      return 1;
    }
    KernelCache& cache = *opened;
    print_notices(cache);
    if (take_wal && !st->json) fmt::print("any -wal beside {} is folded in (the file has a fresh file id)\n", path);
    if ((st->imp->parsed() || st->gc->parsed()) && !cache.writable())
      throw CacheError(fmt::format("cache {} is read-only: `cache {}` would change it", path,
                                   st->imp->parsed() ? "import" : "gc"));
    nlohmann::json j;
    if (!wal_set_aside.empty()) j["wal_set_aside"] = wal_set_aside;
    if (st->list->parsed()) {
      j = nlohmann::json::array();  // no winners: [], not null
      const auto winners = cache.all_winners();
      for (const auto& w : winners) {
        if (st->json)
          j.push_back({{"family", w.key.family}, {"shape", w.key.shape}, {"bucket", w.key.token_bucket},
                       {"device", w.key.device}, {"policy", w.key.policy}, {"tile", w.config},
                       {"median_ms", w.median_ms}, {"default_ms", w.default_ms}});
        else
          fmt::print("{:<16} T~{:<6} {:<22} {:>8.3f} ms (default {:>8.3f})  {} | {}\n", w.key.family,
                     w.key.token_bucket, w.config, w.median_ms, w.default_ms, w.key.shape, w.key.device);
      }
      if (!st->json) fmt::print("{} winners in {}\n", winners.size(), path);
    } else {
      if (st->exp->parsed()) {
        cache.export_to(st->file);
        j["exported_to"] = st->file;
        if (!st->json) fmt::print("exported {} to {}\n", path, st->file);
      }
      if (st->imp->parsed()) {
        const ImportReport r = cache.import_from(st->file, tuning_row_problem);
        j["imported_rows"] = r.taken();
        j["import"] = import_json(r);
        if (!st->json) print_import(r, "imported", fmt::format(" from {} into {}", st->file, path));
      }
      if (st->verify->parsed()) {
        const VerifyReport v = cache.verify(st->fix);
        if (!v.integrity_ok && st->fix) {  // damage quick_check did not see: salvage as well
          opened.reset();
          return salvage(path, st->json);
        }
        j["verify"] = {{"integrity_ok", v.integrity_ok}, {"binaries_checked", v.binaries_checked},
                       {"bad_checksums", v.bad_checksums}, {"deleted", v.deleted}, {"problems", v.problems}};
        if (!st->json) {
          fmt::print("integrity {}, {} binaries checked, {} bad checksums{}\n", v.integrity_ok ? "ok" : "FAILED",
                     v.binaries_checked, v.bad_checksums,
                     st->fix && v.bad_checksums ? fmt::format(" ({} deleted, rebuilt when next needed)", v.deleted) : "");
          for (const auto& p : v.problems) fmt::print("  {}\n", p);
          if (!v.integrity_ok)
            fmt::print("the file is left as it is; `moeblaze cache verify --fix --db {}` salvages its readable rows\n",
                       path);
        }
        if (!v.integrity_ok || (v.bad_checksums && !st->fix)) {
          if (st->json) emit_json(j);
          return 1;
        }
      }
      if (st->gc->parsed()) {
        const int64_t n = cache.gc(max_bytes);
        j["gc_deleted"] = n;
        if (!st->json) fmt::print("gc deleted {} binaries\n", n);
      }
      const CacheSummary s = cache.summary();
      j["summary"] = {{"path", s.path}, {"schema_version", s.schema_version}, {"binaries", s.binaries},
                      {"binary_bytes", s.binary_bytes}, {"measurements", s.measurements}, {"failures", s.failures},
                      {"winners", s.winners}, {"file_bytes", s.file_bytes}};
      if (!st->json)
        fmt::print("{} (schema {}): {} binaries ({:.1f} MiB), {} measurements ({} failures), {} winners, file {:.1f} MiB\n",
                   s.path, s.schema_version, s.binaries,
                   s.binary_bytes / 1048576.0, s.measurements, s.failures, s.winners, s.file_bytes / 1048576.0);
    }
    if (st->json) emit_json(j);
    return 0;
  };
  return c;
}

}  // namespace moeblaze::cli
