// `moeblaze generate` and `moeblaze presets`: no GPU needed.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cache/kernel_cache.hpp"
#include "cli/commands.hpp"
#include "cli/json_report.hpp"
#include "core/errors.hpp"
#include "generator/heuristics.hpp"
#include "runtime/kernel_build.hpp"
#include "runtime/kernel_set.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace moeblaze::cli {

std::string cache_path_option(const std::string& db);  // cmd_cache.cpp

namespace {

// The tensor-core instruction a kernel's PTX uses: "wgmma", "mma.sync" or "-".
std::string tensor_instruction(const BuiltKernel& b) {
  if (b.compiled.ptx.find("wgmma.mma_async") != std::string::npos) return "wgmma";
  if (b.compiled.ptx.find("mma.sync") != std::string::npos) return "mma.sync";
  return "-";
}

// A folder this process can create files in, checked by creating one (the mode bits do not
// tell for root, nor on a read-only file system), before minutes of compiling whose output
// would then have nowhere to go.
void require_writable_folder(const std::string& folder, const char* option) {
  std::string probe = (std::filesystem::path(folder) / ".moeblaze-write-check-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0)
    throw InvalidArgument(option, fmt::format("cannot write in '{}': {}", folder, std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace

Command presets_command() {
  auto app = std::make_shared<CLI::App*>(nullptr);
  auto json = std::make_shared<bool>(false);
  Command c;
  c.add = [=](CLI::App& root) {
    *app = root.add_subcommand("presets", "list the model presets (the benchmark suite first)");
    (*app)->add_flag("--json", *json, "machine-readable output");
  };
  c.selected = [=] { return (*app)->parsed(); };
  c.run = [=] {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& p : presets()) {
      const auto& s = p.layer.shape;
      if (*json)
        j.push_back({{"name", p.name}, {"E", s.experts}, {"K", s.topk}, {"d", s.hidden}, {"n", s.ffn}, {"T", p.tokens},
                     {"router", to_string(p.layer.router)}, {"renormalize", p.layer.renormalize},
                     {"route_scale", p.layer.route_scale}, {"suite", p.in_suite}});
      else
        fmt::print("{:<18} E={:<4} K={:<3} d={:<5} n={:<6} T={:<6} router={}{}{}\n", p.name, s.experts, s.topk,
                   s.hidden, s.ffn, p.tokens, to_string(p.layer.router), p.layer.renormalize ? ",renorm" : "",
                   p.in_suite ? "  [suite]" : "");
    }
    if (*json) emit_json(j);
    return 0;
  };
  return c;
}

Command generate_command() {
  struct State {
    CLI::App* app = nullptr;
    ShapeOptions shape;
    std::string arch = "sm_90a";
    bool json = false, show_source = false, check_only = false, quiet = false;
    std::vector<std::string> tiles;
    std::string ptx_dir;
    std::string db;
  };
  auto st = std::make_shared<State>();
  Command c;
  c.add = [st](CLI::App& root) {
    st->app = root.add_subcommand("generate", "generate and NVRTC-compile every kernel of a layer (no GPU needed)");
    st->shape.add(st->app, false);
    // The default tiles' token rule (heuristics.cpp few_slots_per_expert): the preset's T is not
    // assumed, since one compiled set serves every T.
    st->shape.tokens_option = st->app->add_option("--tokens,-T", st->shape.tokens,
                        "tokens per step T the default tiles are chosen for (default: none, the E/K rule)");
    st->app->add_option("--arch", st->arch, "target architecture")->capture_default_str();
    st->app->add_flag("--json", st->json, "machine-readable output");
    st->app->add_flag("--source", st->show_source, "print each generated instantiation source");
    st->app->add_flag("--quiet", st->quiet, "no progress lines on stderr");
    st->app->add_option("--tile", st->tiles, "FAMILY=TILE: another tile for a family (e.g. gate_up=128x128x64_w8x1_s3_wgmma)");
    st->app->add_option("--ptx-dir", st->ptx_dir, "write each kernel's PTX to DIR/<kernel>.ptx (created if missing)");
    st->app->add_option("--db", st->db,
                        "also store each kernel in this cache file, taking those already there from it (fills a cache on a "
                        "machine without a GPU for one that has no toolkit or fewer cores)");
    st->app->add_flag("--check-only", st->check_only,
                      "check that every kernel's tile is legal for the layer and generate its source, without "
                      "compiling (fast; what tools/gpu_run.sh --dry-run runs)");
  };
  c.selected = [st] { return st->app->parsed(); };
  c.run = [st] {
    const LayerConfig layer = st->shape.layer();
    Arch arch;
    try {
      arch = parse_arch(st->arch);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("--arch", e.reason);
    }
    const int64_t tokens = st->shape.tokens_given() ? st->shape.token_count(0) : 0;
    auto specs = layer_kernel_specs(layer, arch, tokens);
    for (const auto& [f, tile] : parse_tiles(st->tiles, "--tile"))
      for (auto& s : specs)
        if (s.family == f) s.tile = tile;
    tie_following_tiles(specs);
    if (st->check_only) {  // generate() throws InvalidArgument("tile", why) on an illegal tile
      std::vector<GeneratedKernel> generated;
      for (const auto& s : specs) generated.push_back(generate(s));
      if (st->json) {
        nlohmann::json kernels = nlohmann::json::array();
        for (const auto& g : generated) {
          const auto& s = g.spec;
          nlohmann::json k{{"family", to_string(s.family)}, {"tile", is_tiled(s.family) ? s.tile.to_string() : "-"}};
          if (st->show_source) k["source"] = g.source.text;
          kernels.push_back(std::move(k));
        }
        emit_json({{"layer", layer.describe()}, {"arch", st->arch}, {"tokens", tokens}, {"kernels", kernels}});
      } else {
        fmt::print("{} for {}: {} kernels, every tile legal\n", layer.describe(), st->arch, specs.size());
        for (const auto& g : generated)
          if (st->show_source) fmt::print("{}\n", g.source.text);
      }
      return 0;
    }
    if (!st->ptx_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(st->ptx_dir, ec);
      if (ec || !std::filesystem::is_directory(st->ptx_dir))
        throw InvalidArgument("--ptx-dir", fmt::format("'{}' is not a folder that can be created ({})", st->ptx_dir,
                                                       ec ? ec.message() : "a file is in the way"));
      require_writable_folder(st->ptx_dir, "--ptx-dir");
    }
    // Compiling a layer takes a while (tens of seconds): a phase line, and a count with an
    // estimate on a terminal.
    const auto say = progress_printer(st->quiet);
    BuildOptions bo{nullptr, 0, true};
    bo.progress = [&](const BuildProgress& p) {
      if (p.done == 0) say(fmt::format("compiling {} kernels of {} with NVRTC", p.total, layer.describe()), false);
      else say(p.line(), p.done < p.total);
    };
    std::vector<BuiltKernel> built;
    if (st->db.empty()) {
      built = build_all(specs, bo);
    } else {
      KernelCache cache(cache_path_option(st->db));
      bo.cache = &cache;
      bo.keep_ptx = !st->ptx_dir.empty();
      built = build_all(specs, bo);
    }
    for (const auto& b : built) {
      if (st->ptx_dir.empty()) break;
      const auto path = std::filesystem::path(st->ptx_dir) / (b.compiled.kernel_name + ".ptx");
      std::ofstream f(path, std::ios::binary);
      f << b.compiled.ptx;
      if (!f) throw InvalidArgument("--ptx-dir", fmt::format("cannot write '{}'", path.string()));
    }
    int spills = 0;
    nlohmann::json kernels = nlohmann::json::array();
    if (!st->json) fmt::print("{} for {} (NVRTC {})\n", layer.describe(), st->arch, nvrtc_version());
    for (const auto& b : built) {
      const auto& r = b.compiled.resources;
      spills += r.has_spills();
      if (st->json) {
        nlohmann::json k{{"family", to_string(b.generated.spec.family)}, {"kernel", b.compiled.kernel_name},
                         {"registers", r.registers}, {"static_smem", r.static_smem_bytes},
                         {"dynamic_smem", b.generated.dynamic_smem}, {"stack", r.stack_bytes},
                         {"spill_stores", r.spill_store_bytes}, {"spill_loads", r.spill_load_bytes},
                         {"cubin_bytes", b.compiled.cubin.size()}, {"code_bytes", r.code_bytes},
                         {"compile_ms", std::round(b.compiled.compile_ms)},
                         {"tile", is_tiled(b.generated.spec.family) ? b.generated.spec.tile.to_string() : "-"},
                         {"mma", tensor_instruction(b)}};
        if (st->show_source) k["source"] = b.generated.source.text;
        kernels.push_back(std::move(k));
        continue;
      }
      // code: the kernel's machine code, KiB (how far an epilogue's unrolling has gone).
      fmt::print("  {:<16} regs {:>3}  smem {:>6} + {:>6}  stack {:>3}  spill {:>3}/{:<3}  code {:>4} KiB  {:>5.0f} ms  {:<8} {}\n",
                 to_string(b.generated.spec.family), r.registers, r.static_smem_bytes, b.generated.dynamic_smem,
                 r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes,
                 r.code_bytes < 0 ? std::string("?") : fmt::format("{}", (r.code_bytes + 1023) / 1024),
                 b.compiled.compile_ms, tensor_instruction(b), b.compiled.kernel_name);
      if (st->show_source) fmt::print("{}\n", b.generated.source.text);
    }
    if (st->json)
      emit_json({{"layer", layer.describe()}, {"arch", st->arch}, {"nvrtc", nvrtc_version()}, {"kernels", kernels},
                 {"kernels_with_spills", spills}});
    else fmt::print("{} kernels compiled, {} with spills or stack use\n", built.size(), spills);
    return spills ? 1 : 0;
  };
  return c;
}

}  // namespace moeblaze::cli
