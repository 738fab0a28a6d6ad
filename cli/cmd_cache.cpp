// `moeblaze cache list|show|export|import|verify|gc`.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cache/kernel_cache.hpp"
#include "cli/commands.hpp"
#include "core/errors.hpp"

namespace moeblaze::cli {

std::string cache_path_option(const std::string& db);
void print_notices(const KernelCache& cache);

Command cache_command() {
  struct State {
    CLI::App* app = nullptr;
    CLI::App *list = nullptr, *show = nullptr, *exp = nullptr, *imp = nullptr, *verify = nullptr, *gc = nullptr;
    std::string db, file;
    double max_mb = 1024;
    bool json = false, fix = false;
  };
  auto st = std::make_shared<State>();
  Command c;
  c.add = [st](CLI::App& root) {
    st->app = root.add_subcommand("cache", "inspect and manage the kernel cache");
    st->app->require_subcommand(1);
    st->app->add_option("--db", st->db, "cache file (default: $MOEBLAZE_CACHE or ~/.cache/moeblaze/kernels.db)");
    st->app->add_flag("--json", st->json, "machine-readable output");
    st->list = st->app->add_subcommand("list", "tuned winners");
    st->show = st->app->add_subcommand("show", "summary: rows, sizes, schema, notices");
    st->exp = st->app->add_subcommand("export", "write a portable copy (a team can ship tuned results)");
    st->exp->add_option("file", st->file, "file to create")->required();
    st->imp = st->app->add_subcommand("import", "take the rows of an exported file");
    st->imp->add_option("file", st->file, "exported file")->required();
    st->verify = st->app->add_subcommand("verify", "integrity check and blob checksums");
    st->verify->add_flag("--fix", st->fix, "delete rows whose checksum fails");
    st->gc = st->app->add_subcommand("gc", "shrink binaries to a size cap (unreferenced first)");
    st->gc->add_option("--max-mb", st->max_mb, "cap in MiB")->capture_default_str();
    for (CLI::App* s : {st->list, st->show, st->exp, st->imp, st->verify, st->gc}) {
      s->add_option("--db", st->db, "cache file");
      s->add_flag("--json", st->json, "machine-readable output");
    }
  };
  c.selected = [st] { return st->app->parsed(); };
  c.run = [st] {
    const std::string path = cache_path_option(st->db);
    KernelCache cache(path, st->list->parsed() || st->show->parsed() || st->exp->parsed());
    print_notices(cache);
    nlohmann::json j;
    if (st->list->parsed()) {
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
    } else if (st->show->parsed() || st->verify->parsed() || st->gc->parsed() || st->imp->parsed() ||
               st->exp->parsed()) {
      if (st->exp->parsed()) {
        cache.export_to(st->file);
        j["exported_to"] = st->file;
        if (!st->json) fmt::print("exported {} to {}\n", path, st->file);
      }
      if (st->imp->parsed()) {
        const int64_t n = cache.import_from(st->file);
        j["imported_rows"] = n;
        if (!st->json) fmt::print("imported {} rows from {} into {}\n", n, st->file, path);
      }
      if (st->verify->parsed()) {
        const VerifyReport v = cache.verify(st->fix);
        j["verify"] = {{"integrity_ok", v.integrity_ok}, {"binaries_checked", v.binaries_checked},
                       {"bad_checksums", v.bad_checksums}, {"problems", v.problems}};
        if (!st->json) {
          fmt::print("integrity {}, {} binaries checked, {} bad checksums{}\n", v.integrity_ok ? "ok" : "FAILED",
                     v.binaries_checked, v.bad_checksums, st->fix && v.bad_checksums ? " (deleted)" : "");
          for (const auto& p : v.problems) fmt::print("  {}\n", p);
        }
        if (!v.integrity_ok || (v.bad_checksums && !st->fix)) {
          if (st->json) fmt::print("{}\n", j.dump(2));
          return 1;
        }
      }
      if (st->gc->parsed()) {
        if (st->max_mb < 0) throw InvalidArgument("--max-mb", "must not be negative");
        const int64_t n = cache.gc(static_cast<int64_t>(st->max_mb * 1048576.0));
        j["gc_deleted"] = n;
        if (!st->json) fmt::print("gc deleted {} binaries\n", n);
      }
      const CacheSummary s = cache.summary();
      j["summary"] = {{"path", s.path}, {"schema_version", s.schema_version}, {"binaries", s.binaries},
                      {"binary_bytes", s.binary_bytes}, {"measurements", s.measurements}, {"failures", s.failures},
                      {"winners", s.winners}, {"file_bytes", s.file_bytes}};
      if (!st->json)
        fmt::print("{} (schema {}): {} binaries ({:.1f} MiB), {} measurements ({} failures), {} winners, file {:.1f} MiB\n",
                   s.path, s.schema_version, s.binaries, s.binary_bytes / 1048576.0, s.measurements, s.failures,
                   s.winners, s.file_bytes / 1048576.0);
    }
    if (st->json) fmt::print("{}\n", j.dump(2));
    return 0;
  };
  return c;
}

}  // namespace moeblaze::cli
