// Generator and NVRTC pipeline tests (no GPU): every kernel of every suite shape compiles
// for sm_90a without spills; each template header compiles on its own; presets agree with
// the suite definition (bench/suite.json); names and legality rules.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <array>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "core/errors.hpp"
#include "core/hash.hpp"
#include "generator/embedded_templates.hpp"
#include "generator/heuristics.hpp"
#include "generator/kernel_layer.hpp"
#include "generator/kernel_spec.hpp"
#include "runtime/cubin_code.hpp"
#include "runtime/kernel_set.hpp"
#include "runtime/nvrtc_compiler.hpp"

using namespace moeblaze;

namespace {

void check_compiled_without_spills(const std::vector<BuiltKernel>& built) {
  for (const auto& b : built) {
    INFO(b.compiled.kernel_name);
    CHECK(!b.compiled.cubin.empty());
    CHECK(b.compiled.resources.registers > 0);
    CHECK(b.compiled.resources.spill_store_bytes == 0);
    CHECK(b.compiled.resources.spill_load_bytes == 0);
    CHECK(b.compiled.resources.stack_bytes == 0);
    CHECK(b.compiled.resources.registers <= 255);
  }
}

}  // namespace

TEST_CASE("generator: every kernel of every suite shape compiles for sm_90a without spills") {
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      const auto specs = layer_kernel_specs(p.layer, Arch::sm_90a);
      size_t runs = 0;
      for (KernelFamily f : all_families()) runs += family_runs(f, p.layer);
      CHECK(specs.size() == runs);
      CHECK(runs == all_families().size() - 2);  // suite shapes: the built-in router, no expert biases
      check_compiled_without_spills(compile_all(specs));
    }
  }
}

TEST_CASE("generator: the default expert GEMM tiles compile for the small shapes the GPU checks run") {
  // tools/gpu_run.sh's small grad-checks: d or n not multiples of 64, 128 or 256, and
  // multiples of 192 (where 192-wide defaults are chosen only with TMA loads: a 192-wide
  // cp.async default for d = 192, n = 520 once failed its static_assert on the GPU machine).
  const int shapes[][4] = {{8, 2, 256, 128},  {60, 4, 200, 200}, {64, 8, 256, 192}, {8, 2, 128, 1000},
                           {6, 2, 192, 520},  {60, 4, 136, 200}, {60, 4, 448, 320}, {64, 8, 576, 192},
                           {8, 2, 384, 192},  {60, 4, 200, 256}, {60, 4, 192, 256}, {60, 4, 192, 200}};
  for (const auto& sh : shapes) {
    LayerConfig l;
    l.shape = {sh[0], sh[1], sh[2], sh[3]};
    l.activation = sh[3] == 520 ? Activation::gelu : Activation::swiglu;
    const std::string name = fmt::format("E={} K={} d={} n={}", sh[0], sh[1], sh[2], sh[3]);
    SUBCASE(name.c_str()) {
      std::vector<KernelSpec> picked;
      for (const auto& s : layer_kernel_specs(l, Arch::sm_90a)) {
        INFO(to_string(s.family) << " " << s.tile.to_string());
        REQUIRE(legality_problem(s).empty());
        if (s.family == KernelFamily::gate_up_dgrad || s.family == KernelFamily::down_proj ||
            s.family == KernelFamily::gate_up_wgrad || s.family == KernelFamily::down_wgrad)
          picked.push_back(s);
      }
      check_compiled_without_spills(compile_all(picked));
    }
  }
}

TEST_CASE("generator: every activation and router variant compiles (caller routing, both routers)") {
  for (Activation act : {Activation::swiglu, Activation::geglu, Activation::silu, Activation::gelu, Activation::relu}) {
    for (RouterKind r : {RouterKind::none, RouterKind::softmax_topk, RouterKind::sigmoid_topk}) {
      LayerConfig l;
      l.shape = {60, 6, 200, 136};  // E not a multiple of 8, d and n not multiples of 64
      l.activation = act;
      l.router = r;
      l.renormalize = r == RouterKind::sigmoid_topk;
      const std::string name = fmt::format("{} / {}", to_string(act), to_string(r));
      SUBCASE(name.c_str()) {
        auto specs = layer_kernel_specs(l, Arch::sm_90a);
        // Only the kernels that depend on the activation or the router: the rest are
        // covered by the suite test.
        std::vector<KernelSpec> picked;
        for (const auto& s : specs)
          if (s.family == KernelFamily::gate_up || s.family == KernelFamily::down_dgrad ||
              s.family == KernelFamily::router_topk || s.family == KernelFamily::router_backward ||
              (act == Activation::swiglu && r == RouterKind::softmax_topk))
            picked.push_back(s);
        check_compiled_without_spills(compile_all(picked));
      }
    }
  }
}

TEST_CASE("generator: the up-side kernels of a fused gate_up layer compile and are named apart") {
  // The Hugging Face gate_up [E,2n,d]: W1/W3 step 2n rows per expert. Defaults (TMA where
  // legal) and the cp.async tiles, n a multiple of 64 and not.
  for (const auto& sh : {std::array<int, 4>{128, 8, 2048, 768}, std::array<int, 4>{8, 2, 200, 136}}) {
    LayerConfig l;
    l.shape = {sh[0], sh[1], sh[2], sh[3]};
    l.weight_layout = WeightLayout::fused_gate_up;
    SUBCASE(fmt::format("E={} n={}", sh[0], sh[3]).c_str()) {
      std::vector<KernelSpec> picked;
      for (const auto& s : layer_kernel_specs(l, Arch::sm_90a))
        if (s.family == KernelFamily::gate_up || s.family == KernelFamily::gate_up_wgrad ||
            s.family == KernelFamily::gate_up_dgrad) {
          picked.push_back(s);
          LayerConfig separate = l;
          separate.weight_layout = WeightLayout::separate;
          const KernelSpec other{s.family, separate, s.tile, s.arch};
          CHECK(s.name() != other.name());
          CHECK(s.name().find("_fused") != std::string::npos);
          // The expert stride is 2n rows: compiled into the hand-written kernels; the kernel
          // layer's gate_up_wgrad stores through output maps whose expert stride the runtime
          // sets from w1_rows() (runtime/moe_layer.cpp), so its source is the separate layout's.
          if (s.tile.cute && s.family == KernelFamily::gate_up_wgrad) {
            CHECK(l.w1_rows() == 2 * sh[3]);
            // The same code as the separate layout's kernel: past the comment line, only the name differs.
            std::string fused_src = generate(s).source.text, separate_src = generate(other).source.text;
            fused_src.erase(0, fused_src.find('\n'));
            separate_src.erase(0, separate_src.find('\n'));
            const size_t at = separate_src.find(other.name());
            REQUIRE(at != std::string::npos);
            separate_src.replace(at, other.name().size(), s.name());
            CHECK(fused_src == separate_src);
          } else {
            CHECK(generate(s).source.text.find(fmt::format("swiglu, {}", 2 * sh[3])) != std::string::npos);
          }
        }
      REQUIRE(picked.size() == 3);
      check_compiled_without_spills(compile_all(picked));
    }
  }
}

TEST_CASE("generator: GPT-OSS's experts (clamped SwiGLU, expert biases, fused gate_up) compile without spills") {
  // The suite's gpt-oss-20b shape and a small one; the kernels the activation and the biases
  // change, and the two bias-gradient kernels (which only such layers run).
  for (const auto& sh : {std::array<int, 4>{32, 4, 2880, 2880}, std::array<int, 4>{8, 2, 128, 64}}) {
    LayerConfig l;
    l.shape = {sh[0], sh[1], sh[2], sh[3]};
    l.activation = Activation::clamped_swiglu;
    l.weight_layout = WeightLayout::fused_gate_up;
    l.expert_bias = true;
    SUBCASE(fmt::format("E={} d={} n={}", sh[0], sh[2], sh[3]).c_str()) {
      CHECK(l.describe().find("clamped_swiglu") != std::string::npos);
      CHECK(l.describe().find(" bias") != std::string::npos);
      std::vector<KernelSpec> picked;
      for (const auto& s : layer_kernel_specs(l, Arch::sm_90a))
        if (s.family == KernelFamily::gate_up || s.family == KernelFamily::down_proj ||
            s.family == KernelFamily::down_dgrad || s.family == KernelFamily::bias_grad ||
            s.family == KernelFamily::gate_bias_grad)
          picked.push_back(s);
      REQUIRE(picked.size() == 5);
      for (const auto& s : picked)
        if (s.family == KernelFamily::gate_up || s.family == KernelFamily::down_proj)
          CHECK(s.name().find("_bias") != std::string::npos);
      check_compiled_without_spills(compile_all(picked));
    }
  }
  LayerConfig plain;
  plain.shape = {8, 2, 128, 64};
  for (const auto& s : layer_kernel_specs(plain, Arch::sm_90a))  // no biases: no bias kernels
    CHECK((s.family != KernelFamily::bias_grad && s.family != KernelFamily::gate_bias_grad));
}

TEST_CASE("generator: the silu-family epilogues compute the sigmoid without an IEEE division") {
  // gate_up and down_dgrad apply the activation unrolled over a whole tile; an IEEE divide is
  // ~10 instructions and a slow-path call per element, each a long dependent chain (down_dgrad
  // 19% slower with them, docs/performance.md): the sigmoid is rcp.approx(1 + exp(-a)).
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      REQUIRE(p.layer.activation == Activation::swiglu);
      std::vector<KernelSpec> picked;
      for (const auto& s : layer_kernel_specs(p.layer, Arch::sm_90a))
        if (s.family == KernelFamily::gate_up || s.family == KernelFamily::down_dgrad) picked.push_back(s);
      REQUIRE(picked.size() == 2);
      for (const auto& b : compile_all(picked, 0, true)) {  // keep the PTX
        REQUIRE(!b.compiled.ptx.empty());
        INFO(b.compiled.kernel_name);
        CHECK(b.compiled.ptx.find("div.rn.f32") == std::string::npos);
        CHECK(b.compiled.ptx.find("rcp.rn.f32") == std::string::npos);
        CHECK(b.compiled.ptx.find("rcp.approx.ftz.f32") != std::string::npos);
      }
    }
  }
}

TEST_CASE("generator: down_dgrad's warp-specialised consumers prefetch the epilogue's H into L2") {
  // H is read once, by the epilogue: a mainloop step hook (PrefetchTileH) brings the tile's lines
  // into L2 a few k-steps ahead; the kernel layer's down_dgrad (deepseek-v3's default) prefetches
  // its H boxes by TMA instead. One-tile `_wgmma` blocks have no such hook (their loads are
  // staged after the mainloop), and no other family prefetches.
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      std::vector<KernelSpec> picked;
      for (const auto& s : layer_kernel_specs(p.layer, Arch::sm_90a))
        if (s.family == KernelFamily::down_dgrad || s.family == KernelFamily::gate_up) picked.push_back(s);
      REQUIRE(picked.size() == 2);
      KernelSpec one_tile = picked[0].family == KernelFamily::down_dgrad ? picked[0] : picked[1];
      REQUIRE(one_tile.tile.warp_specialized());
      one_tile.tile = TileConfig::parse("128x128x64_w8x1_s3_wgmma");
      picked.push_back(one_tile);
      for (const auto& b : compile_all(picked, 0, true)) {  // keep the PTX
        INFO(b.compiled.kernel_name);
        const TileConfig& t = b.generated.spec.tile;
        const bool dgrad = b.generated.spec.family == KernelFamily::down_dgrad;
        const bool hooked = dgrad && t.warp_specialized() && !t.cute;
        CHECK((b.compiled.ptx.find("prefetch.global.L2 ") != std::string::npos) == hooked);
        CHECK((b.compiled.ptx.find("cp.async.bulk.prefetch.tensor") != std::string::npos) == (dgrad && t.cute));
        CHECK(!b.compiled.resources.has_spills());
      }
    }
  }
}

TEST_CASE("generator: each compiled kernel reports its machine code size from the cubin") {
  const Preset* gpt = nullptr;
  for (const Preset& p : presets())
    if (p.name == "gpt-oss-20b") gpt = &p;
  REQUIRE(gpt != nullptr);
  std::vector<KernelSpec> picked;
  for (const auto& s : layer_kernel_specs(gpt->layer, Arch::sm_90a))
    if (s.family == KernelFamily::combine || s.family == KernelFamily::down_dgrad) picked.push_back(s);
  REQUIRE(picked.size() == 2);
  const auto built = compile_all(picked);
  for (const auto& b : built) {
    INFO(b.compiled.kernel_name);
    const int64_t code = b.compiled.resources.code_bytes;
    CHECK(code > 0);
    CHECK(code % 16 == 0);  // sm_90 instructions are 16 bytes
    CHECK(code < static_cast<int64_t>(b.compiled.cubin.size()));
    CHECK(kernel_code_bytes(b.compiled.cubin, b.compiled.kernel_name) == code);
    CHECK(kernel_code_bytes(b.compiled.cubin, b.compiled.kernel_name + "_other") == -1);  // no such section
  }
  // The down dgrad (a tiled GEMM with its epilogue) is far larger than the combine.
  const bool dgrad_first = built[0].generated.spec.family == KernelFamily::down_dgrad;
  CHECK(built[dgrad_first ? 0 : 1].compiled.resources.code_bytes >
        4 * built[dgrad_first ? 1 : 0].compiled.resources.code_bytes);
  // Not an ELF64 cubin: unknown, not a crash.
  CHECK(kernel_code_bytes({}, "k") == -1);
  CHECK(kernel_code_bytes(std::vector<char>(100, 'x'), "k") == -1);
  std::vector<char> cut(built[0].compiled.cubin.begin(), built[0].compiled.cubin.begin() + 80);
  CHECK(kernel_code_bytes(cut, built[0].compiled.kernel_name) == -1);  // section headers missing
}

TEST_CASE("generator: each template header compiles on its own under NVRTC") {
  for (const auto& t : embedded_templates()) {
    SUBCASE(t.name) {
      KernelSource src;
      src.kernel_name = "header_alone";
      src.file_name = std::string("header_alone_") + t.name;
      src.text = fmt::format("#include \"{}\"\nextern \"C\" __global__ void header_alone() {{}}\n", t.name);
      src.needs_cutlass = header_needs_cutlass(t.name);
      const CompiledKernel k = compile_kernel(src, CompileOptions{});
      CHECK(!k.cubin.empty());
    }
  }
}

TEST_CASE("generator: an NVRTC failure carries the log, options, source and kernel name") {
  KernelSource src{"broken_kernel", "broken_kernel.cu", "extern \"C\" __global__ void broken_kernel() { undefined_thing(); }\n"};
  try {
    compile_kernel(src, CompileOptions{});
    FAIL("compile should have thrown");
  } catch (const CompileError& e) {
    CHECK(e.kernel_name == "broken_kernel");
    CHECK(e.log.find("undefined_thing") != std::string::npos);
    CHECK(e.source == src.text);
    CHECK(!e.options.empty());
    CHECK(std::string(e.what()).find("--gpu-architecture=sm_90a") != std::string::npos);
  }
}

TEST_CASE("generator: kernel names are unique per family and tile and name the shape") {
  const LayerConfig l = find_preset("qwen3-30b-a3b").layer;
  const auto specs = layer_kernel_specs(l, Arch::sm_90a);
  std::set<std::string> names;
  for (const auto& s : specs) {
    CHECK(names.insert(s.name()).second);
    CHECK(s.name().find("E128_K8_d2048_n768") != std::string::npos);
    const GeneratedKernel g = generate(s);
    CHECK(g.source.text.find("extern \"C\" __global__") != std::string::npos);
    CHECK(g.source.text.find(s.name()) != std::string::npos);
    CHECK(g.threads > 0);
  }
}

TEST_CASE("generator: legality rules reject impossible tiles with a reason") {
  const LayerConfig l = find_preset("qwen3-30b-a3b").layer;
  KernelSpec s{KernelFamily::down_proj, l, default_tile(KernelFamily::down_proj, l, Arch::sm_90a), Arch::sm_90a};
  CHECK(legality_problem(s).empty());
  s.tile.bk = 32;
  CHECK(!legality_problem(s).empty());
  s.tile = default_tile(KernelFamily::down_proj, l, Arch::sm_90a);
  s.tile.stages = 8;  // 8 * 32 KiB > 227 KiB
  CHECK(legality_problem(s).find("shared memory") != std::string::npos);
  CHECK_THROWS_AS(generate(s), InvalidArgument);
  s.tile = {256, 256, 64, 2, 2, 2};
  CHECK(legality_problem(s).find("accumulator") != std::string::npos);
}

TEST_CASE("generator: resource report parsing") {
  const std::string log =
      "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
      "ptxas info    : Function properties for k\n"
      "    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 2560 bytes smem, 400 bytes cmem[0]\n";
  const ResourceReport r = parse_resource_report(log, "k");
  CHECK(r.registers == 168);
  CHECK(r.stack_bytes == 24);
  CHECK(r.spill_store_bytes == 8);
  CHECK(r.spill_load_bytes == 12);
  CHECK(r.static_smem_bytes == 2560);
  CHECK(r.has_spills());
}

TEST_CASE("generator: presets agree with the suite definition bench/suite.json") {
  const std::string path = std::string(MOEBLAZE_SOURCE_DIR) + "/bench/suite.json";
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.is_open(), path << " not found");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const std::regex row(R"re(\{"name":\s*"([^"]+)",\s*"E":\s*(\d+),\s*"K":\s*(\d+),\s*"d":\s*(\d+),\s*"n":\s*(\d+),\s*"T":\s*(\d+)\})re");
  int seen = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), row); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    const Preset& p = find_preset(m[1]);
    CHECK(p.in_suite);
    CHECK(p.layer.shape.experts == std::stoi(m[2]));
    CHECK(p.layer.shape.topk == std::stoi(m[3]));
    CHECK(p.layer.shape.hidden == std::stoi(m[4]));
    CHECK(p.layer.shape.ffn == std::stoi(m[5]));
    CHECK(p.tokens == std::stoll(m[6]));
    ++seen;
  }
  CHECK(seen == 6);
}

TEST_CASE("generator: the template hash changes with the templates and is stable") {
  CHECK(templates_hash() == templates_hash());
  CHECK(fnv1a64("a") != fnv1a64("b"));
  CHECK(embedded_templates().size() >= 8);
}

// Compiles the nine GEMM families of every suite shape with the tile `pick` returns and checks
// the PTX for wgmma (no mma.sync) and the cubin for spills.
template <class Pick>
void check_wgmma_tiles_compile(Pick pick, bool warp_specialized, bool persistent = false) {
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      std::vector<KernelSpec> specs;
      for (const auto& s : layer_kernel_specs(p.layer, Arch::sm_90a)) {
        if (!is_tiled(s.family)) continue;
        const KernelSpec w{s.family, p.layer, pick(s.family), Arch::sm_90a};
        REQUIRE_MESSAGE(legality_problem(w).empty(), legality_problem(w));
        specs.push_back(w);
      }
      REQUIRE(specs.size() == 9);
      const auto built = compile_all(specs, 0, true);
      std::vector<BuiltKernel> exact;
      for (const auto& b : built) {
        // Known: the persistent 128x128 gate_up (W1 and W3 stacked: 128 accumulators and the
        // gated epilogue under the consumers' 200 registers) spills a few bytes (gemm/mainloop/warp_specialized.cuh).
        if (persistent && b.generated.spec.family == KernelFamily::gate_up) {
          INFO(b.compiled.kernel_name);
          CHECK(b.compiled.resources.spill_store_bytes <= 64);
          continue;
        }
        exact.push_back(b);
      }
      check_compiled_without_spills(exact);
      for (const auto& b : built) {
        INFO(b.compiled.kernel_name);
        const bool p_tile = b.generated.spec.tile.persistent();
        CHECK(p_tile == (persistent && supports_persistent(b.generated.spec.family)));
        // Warp-specialised tiles split registers between roles, except the router GEMMs'
        // one-tile blocks, which split inside the mainloop.
        CHECK((b.compiled.ptx.find("setmaxnreg.inc.sync.aligned.u32") != std::string::npos) ==
              (warp_specialized && supports_persistent(b.generated.spec.family)));
        CHECK(b.compiled.ptx.find("wgmma.mma_async.sync.aligned.m64n") != std::string::npos);
        CHECK(b.compiled.ptx.find("mma.sync.aligned.m16n8k16") == std::string::npos);
        CHECK((b.compiled.ptx.find("mbarrier.try_wait") != std::string::npos) == warp_specialized);
        CHECK((b.compiled.ptx.find("cp.async.mbarrier.arrive.noinc") != std::string::npos) == warp_specialized);
      }
    }
  }
}

TEST_CASE("generator: wgmma tiles compile for every GEMM of every suite shape, use wgmma, do not spill") {
  check_wgmma_tiles_compile(
      [](KernelFamily f) {
        // Gated gate_up stacks W1 and W3: bn 128 keeps 128 accumulators per thread.
        return f == KernelFamily::gate_up ? wgmma_tile(128, 128, 3) : wgmma_tile(128, 128, 4);
      },
      false);
  const LayerConfig l = find_preset("qwen3-30b-a3b").layer;
  CHECK(TileConfig::parse("128x128x64_w8x1_s3_wgmma") == wgmma_tile(128, 128, 3));
  CHECK(wgmma_tile(128, 128, 3).to_string() == "128x128x64_w8x1_s3_wgmma");
  CHECK(!legality_problem(KernelSpec{KernelFamily::down_wgrad, l, TileConfig{128, 128, 64, 2, 4, 3, Mainloop::wgmma_multistage}, Arch::sm_90a})
             .empty());  // wgmma needs the bm/16 x 1 warp layout
}

TEST_CASE("generator: warp-specialised wgmma tiles compile for every GEMM of every suite shape, do not spill") {
  check_wgmma_tiles_compile(
      [](KernelFamily f) {
        return f == KernelFamily::gate_up ? wgmma_tile(128, 128, 3, Mainloop::warp_specialized)
               : f == KernelFamily::down_proj ? wgmma_tile(128, 256, 3, Mainloop::warp_specialized)
                                              : wgmma_tile(128, 128, 4, Mainloop::warp_specialized);
      },
      true);
  const LayerConfig l = find_preset("qwen3-30b-a3b").layer;
  const TileConfig ws = wgmma_tile(128, 128, 4, Mainloop::warp_specialized);
  CHECK(ws.to_string() == "128x128x64_w8x1_s4_ws");
  CHECK(TileConfig::parse("128x128x64_w8x1_s4_ws") == ws);
  CHECK(ws.threads() == 384);
  CHECK(ws.compute_threads() == 256);
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up_wgrad, l, wgmma_tile(64, 128, 4, Mainloop::warp_specialized), Arch::sm_90a}).empty());
  TileConfig four_groups = wgmma_tile(256, 128, 3, Mainloop::warp_specialized);  // two groups of two slabs
  four_groups.warps_m = 16;  // a slab a warp: four consumer warpgroups
  CHECK(!legality_problem(KernelSpec{KernelFamily::gate_up_wgrad, l, four_groups, Arch::sm_90a}).empty());
}


TEST_CASE("generator: persistent warp-specialised tiles compile for every expert GEMM of every suite shape") {
  check_wgmma_tiles_compile(
      [](KernelFamily f) {
        if (!supports_persistent(f)) return wgmma_tile(128, 64, 4, Mainloop::warp_specialized);  // router GEMMs: one tile per block
        return f == KernelFamily::gate_up ? wgmma_tile(128, 128, 4, Mainloop::persistent) : wgmma_tile(128, 256, 4, Mainloop::persistent);
      },
      true, true);
  const LayerConfig l = find_preset("qwen3-30b-a3b").layer;
  const TileConfig p = wgmma_tile(128, 256, 4, Mainloop::persistent);
  CHECK(p.to_string() == "128x256x64_w8x1_s4_persist");
  CHECK(TileConfig::parse("128x256x64_w8x1_s4_persist") == p);
  CHECK(p.persistent());
  CHECK(p.warp_specialized());
  CHECK(p.threads() == 384);
  CHECK_THROWS_AS(TileConfig::parse("128x256x64_w8x1_s4_wspx"), InvalidArgument);
  for (KernelFamily f : {KernelFamily::router_logits, KernelFamily::router_dgrad, KernelFamily::router_wgrad})
    CHECK(legality_problem(KernelSpec{f, l, wgmma_tile(128, 64, 4, Mainloop::persistent), Arch::sm_90a}) ==
          "persistent tiles are for the expert GEMMs");
  CHECK(legality_problem(KernelSpec{KernelFamily::down_dgrad, l, p, Arch::sm_90a}).empty());
}

TEST_CASE("generator: TMA tiles (gate_up, down_proj, gate_up_wgrad, down_wgrad) compile for every suite shape and issue bulk tensor copies") {
  const TileConfig up_ws = [] { TileConfig t = wgmma_tile(128, 128, 4, Mainloop::warp_specialized); t.tma_contiguous = true; return t; }();
  const TileConfig down_ws = [] { TileConfig t = wgmma_tile(128, 256, 4, Mainloop::warp_specialized); t.tma_contiguous = true; return t; }();
  const TileConfig down_persist = [] { TileConfig t = wgmma_tile(128, 256, 4, Mainloop::persistent); t.tma_contiguous = true; return t; }();
  CHECK(up_ws.to_string() == "128x128x64_w8x1_s4_ws_tmacontig");
  CHECK(TileConfig::parse("128x128x64_w8x1_s4_ws_tmacontig") == up_ws);
  CHECK(TileConfig::parse("128x256x64_w8x1_s4_persist_tmacontig") == down_persist);
  CHECK_THROWS_AS(TileConfig::parse("128x256x64_w8x1_s4_tmacontig"), InvalidArgument);
  CHECK_THROWS_AS(TileConfig::parse("128x256x64_w8x1_s4_ws_tmax"), InvalidArgument);
  const LayerConfig q = find_preset("qwen3-30b-a3b").layer;
  CHECK(legality_problem(KernelSpec{KernelFamily::router_dgrad, q, down_ws, Arch::sm_90a}) ==
        "TMA loads are for the expert GEMMs");
  for (KernelFamily f : {KernelFamily::gate_up_wgrad, KernelFamily::down_wgrad, KernelFamily::gate_up_dgrad, KernelFamily::down_dgrad})
    CHECK(legality_problem(KernelSpec{f, q, down_ws, Arch::sm_90a}).empty());
  LayerConfig odd = q;
  odd.shape.ffn = 776;  // W1/W3 k stages would straddle the two matrices
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up_dgrad, odd, down_ws, Arch::sm_90a}).find("n % 64") != std::string::npos);
  TileConfig wg_tma = wgmma_tile(128, 128, 4);
  wg_tma.tma_contiguous = true;
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up, q, wg_tma, Arch::sm_90a}).find("warp-specialised") !=
        std::string::npos);
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      const std::vector<KernelSpec> specs{{KernelFamily::gate_up, p.layer, up_ws, Arch::sm_90a},
                                          {KernelFamily::down_proj, p.layer, down_ws, Arch::sm_90a},
                                          {KernelFamily::down_proj, p.layer, down_persist, Arch::sm_90a},
                                          {KernelFamily::gate_up_wgrad, p.layer, down_ws, Arch::sm_90a},
                                          {KernelFamily::down_wgrad, p.layer, down_persist, Arch::sm_90a},
                                          {KernelFamily::gate_up_dgrad, p.layer, down_ws, Arch::sm_90a},
                                          {KernelFamily::down_dgrad, p.layer, down_ws, Arch::sm_90a}};
      for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), legality_problem(s));
      const auto built = compile_all(specs, 0, true);
      check_compiled_without_spills(built);
      for (const auto& b : built) {
        INFO(b.compiled.kernel_name);
        CHECK(b.generated.source.text.find("__grid_constant__") != std::string::npos);
        CHECK(b.compiled.ptx.find("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes") !=
              std::string::npos);
        CHECK(b.compiled.ptx.find("mbarrier.expect_tx") != std::string::npos);
        CHECK(b.compiled.ptx.find("wgmma.mma_async.sync.aligned.m64n") != std::string::npos);
      }
    }
  }
}

TEST_CASE("generator: 192-column wgmma tiles compile for the expert GEMMs (m64n192k16)") {
  const LayerConfig gpt = find_preset("gpt-oss-20b").layer;
  auto narrow = [](TileConfig t) {
    t.bn = 192;
    return t;
  };
  // down_proj's default there is already 192 wide (ping-pong): its cooperative tile, narrowed.
  TileConfig blocks = wgmma_tile(128, 256, 4, Mainloop::persistent);
  blocks.tma_contiguous = blocks.tma_store = blocks.tma_store_blocks = true;
  const TileConfig persist = narrow(blocks);
  CHECK(persist.to_string() == "128x192x64_w8x1_s4_persist_tmacontig_tmastore64");
  CHECK(TileConfig::parse("128x192x64_w8x1_s4_persist_tmacontig_tmastore64") == persist);
  std::vector<KernelSpec> specs{{KernelFamily::down_proj, gpt, persist, Arch::sm_90a},
                                {KernelFamily::down_proj, gpt, default_tile(KernelFamily::down_proj, gpt, Arch::sm_90a), Arch::sm_90a}};
  for (KernelFamily f : {KernelFamily::gate_up_dgrad, KernelFamily::gate_up_wgrad})
    specs.push_back({f, gpt, narrow(default_tile(f, gpt, Arch::sm_90a)), Arch::sm_90a});
  for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), legality_problem(s));
  const auto built = compile_all(specs, 0, true);
  check_compiled_without_spills(built);
  for (const auto& b : built) {
    INFO(b.compiled.kernel_name);
    CHECK(b.compiled.ptx.find("wgmma.mma_async.sync.aligned.m64n192k16") != std::string::npos);
  }
  // down_dgrad / down_wgrad run in column chunks of a multiple of 256 on wide-h layers.
  for (KernelFamily f : {KernelFamily::down_dgrad, KernelFamily::down_wgrad})
    CHECK(legality_problem(KernelSpec{f, gpt, narrow(wgmma_tile(128, 256, 4, Mainloop::warp_specialized)), Arch::sm_90a}).find("column chunks") !=
          std::string::npos);
  // Gated gate_up stacks W1 and W3: 2 x 192 columns is more accumulators than a thread holds.
  TileConfig up = narrow(wgmma_tile(128, 128, 4, Mainloop::persistent));
  up.tma_contiguous = true;
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up, gpt, up, Arch::sm_90a}).find("accumulator registers") !=
        std::string::npos);
  // Without TMA, the cp.async loader cannot split a 192-wide row among the producer's threads.
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up_dgrad, gpt, narrow(wgmma_tile(128, 256, 4, Mainloop::warp_specialized)), Arch::sm_90a})
            .find("need TMA") != std::string::npos);
}

TEST_CASE("generator: bn of 96, 160, 208, 224 (between the 64-column steps) compile for gate_up and down_proj only") {
  auto tile = [](int bm, int bn, int stages, Mainloop m = Mainloop::persistent) {
    TileConfig t = wgmma_tile(bm, bn, stages, m);
    t.tma_contiguous = true;
    return t;
  };
  CHECK(TileConfig::parse("128x160x64_w8x1_s5_persist_tmacontig") == tile(128, 160, 5));
  for (int bn : {96, 160, 208, 224}) CHECK(is_narrow_step_bn(bn));
  for (int bn : {64, 80, 112, 128, 192, 256}) CHECK(!is_narrow_step_bn(bn));
  const LayerConfig gpt = find_preset("gpt-oss-20b").layer;  // 2880 = 18 x 160 = 30 x 96
  auto problem = [&](KernelFamily f, TileConfig t) { return legality_problem(KernelSpec{f, gpt, t, Arch::sm_90a}); };
  // MN-major weight stages, the 64-column output staging, the cp.async weight loader and a
  // cluster pair's half boxes all need bn % 64 == 0.
  for (KernelFamily f : {KernelFamily::gate_up_dgrad, KernelFamily::down_dgrad, KernelFamily::gate_up_wgrad,
                         KernelFamily::down_wgrad, KernelFamily::router_logits})
    CHECK(problem(f, tile(128, 160, 4)).find("gate_up and down_proj") != std::string::npos);
  TileConfig staged = tile(128, 160, 4);
  staged.tma_store = staged.tma_store_blocks = true;
  CHECK(problem(KernelFamily::down_proj, staged).find("(no _tmastore)") != std::string::npos);
  CHECK(problem(KernelFamily::down_proj, wgmma_tile(128, 160, 4, Mainloop::persistent)).find("_tmacontig") != std::string::npos);
  CHECK(problem(KernelFamily::down_proj, tile(128, 80, 4)).find("96, 160, 208 or 224") != std::string::npos);
  // W1 | W3 stacked: 2 x 208 columns is more accumulators than a thread holds.
  CHECK(problem(KernelFamily::gate_up, tile(128, 208, 4)).find("accumulator registers") != std::string::npos);

  // The m64nN instruction each tile issues: gate_up's W1 | W3 as one instruction where 2 bn <= 256.
  const std::vector<std::pair<KernelSpec, std::string>> cases = {
      {{KernelFamily::gate_up, gpt, tile(128, 96, 5), Arch::sm_90a}, "m64n192k16"},
      {{KernelFamily::gate_up, gpt, tile(128, 160, 4), Arch::sm_90a}, "m64n160k16"},
      {{KernelFamily::down_proj, gpt, tile(128, 160, 5), Arch::sm_90a}, "m64n160k16"},
      {{KernelFamily::down_proj, gpt, tile(128, 208, 4), Arch::sm_90a}, "m64n208k16"},
      {{KernelFamily::down_proj, gpt, tile(128, 224, 4), Arch::sm_90a}, "m64n224k16"},
      {{KernelFamily::down_proj, gpt, tile(128, 160, 5, Mainloop::pingpong), Arch::sm_90a}, "m64n160k16"},
      {{KernelFamily::gate_up, find_preset("qwen3-30b-a3b").layer, tile(128, 96, 5), Arch::sm_90a}, "m64n192k16"},
  };
  std::vector<KernelSpec> specs;
  for (const auto& [s, instr] : cases) {
    REQUIRE_MESSAGE(legality_problem(s).empty(), legality_problem(s));
    specs.push_back(s);
  }
  const auto built = compile_all(specs, 0, true);
  check_compiled_without_spills(built);
  REQUIRE(built.size() == cases.size());
  for (size_t i = 0; i < built.size(); ++i) {
    INFO(built[i].compiled.kernel_name);
    CHECK(built[i].compiled.ptx.find("wgmma.mma_async.sync.aligned." + cases[i].second) != std::string::npos);
  }
}

TEST_CASE("generator: ping-pong warpgroups holding a whole 128 x 192 tile take the 56 / 224 register split and do not spill") {
  // QuACK's gate_up on Hopper: 128 x 192 ping-pong (here W1 | W3 of 2 x 96), alone and as a 2 x 1
  // cluster; down_proj 128 x 192 ping-pong; down_proj 160 as a cluster pair (80-row half boxes).
  auto tile = [](int bm, int bn, int stages, Mainloop m, int cluster) {
    TileConfig t = wgmma_tile(bm, bn, stages, m);
    t.tma_contiguous = true;
    t.cluster_m = cluster;
    return t;
  };
  const LayerConfig q = find_preset("qwen3-30b-a3b").layer;
  // 192 accumulators a thread only in ping-pong; two stacked 128-wide B tiles are 256.
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up, q, tile(128, 128, 4, Mainloop::pingpong, 1), Arch::sm_90a})
            .find("(at most 192)") != std::string::npos);
  CHECK(legality_problem(KernelSpec{KernelFamily::down_proj, q, tile(256, 256, 3, Mainloop::persistent, 1), Arch::sm_90a})
            .find("(at most 160)") != std::string::npos);
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      const std::vector<KernelSpec> specs = {
          {KernelFamily::gate_up, p.layer, tile(128, 96, 5, Mainloop::pingpong, 1), Arch::sm_90a},
          {KernelFamily::gate_up, p.layer, tile(128, 96, 5, Mainloop::pingpong, 2), Arch::sm_90a},
          {KernelFamily::down_proj, p.layer, tile(128, 192, 5, Mainloop::pingpong, 1), Arch::sm_90a},
          {KernelFamily::down_proj, p.layer, tile(128, 160, 4, Mainloop::persistent, 2), Arch::sm_90a},
      };
      for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), legality_problem(s));
      const auto built = compile_all(specs, 0, true);
      check_compiled_without_spills(built);
      REQUIRE(built.size() == specs.size());
      for (size_t i = 0; i < built.size(); ++i) {
        INFO(built[i].compiled.kernel_name);
        const std::string& ptx = built[i].compiled.ptx;
        const bool wide = specs[i].tile.pingpong();
        CHECK((ptx.find("setmaxnreg.inc.sync.aligned.u32 224") != std::string::npos) == wide);
        CHECK((ptx.find("setmaxnreg.dec.sync.aligned.u32 56") != std::string::npos) == wide);
        CHECK(ptx.find(wide ? "m64n192k16" : "m64n160k16") != std::string::npos);
        if (specs[i].tile.cluster_m == 2) {
          CHECK(ptx.find("multicast::cluster") != std::string::npos);
          // the partner's stage released with the default (CTA-scope) semantics: a cluster-scope
          // release is a GPU-wide fence (MEMBAR.ALL.GPU) a warp a k-step
          CHECK(ptx.find("mbarrier.arrive.shared::cluster.b64") != std::string::npos);
          CHECK(ptx.find("mbarrier.arrive.release.cluster") == std::string::npos);
        }
      }
    }
  }
}

TEST_CASE("generator: _tmastore tiles (TMA-store epilogue) compile for the weight gradients and the per-slot outputs of every suite shape") {
  auto tstore = [](TileConfig t) {
    t.tma_contiguous = t.tma_store = true;
    return t;
  };
  const TileConfig wide = tstore(wgmma_tile(128, 256, 3, Mainloop::persistent));
  const TileConfig narrow = tstore(wgmma_tile(128, 128, 4, Mainloop::persistent));
  TileConfig one = wgmma_tile(128, 256, 3, Mainloop::warp_specialized);
  one.tma_store = true;  // one-tile, cp.async loads: the store waits before the block exits
  CHECK(wide.to_string() == "128x256x64_w8x1_s3_persist_tmacontig_tmastore");
  CHECK(TileConfig::parse("128x256x64_w8x1_s3_persist_tmacontig_tmastore") == wide);
  CHECK(TileConfig::parse("128x256x64_w8x1_s3_ws_tmastore") == one);
  TileConfig other_order = wide;
  other_order.alt_order = true;
  CHECK(TileConfig::parse("128x256x64_w8x1_s3_persist_tmacontig_tmastore_altorder") == other_order);
  CHECK_THROWS_AS(TileConfig::parse("128x256x64_w8x1_s3_persist_tmastore_tmacontig"), InvalidArgument);
  const LayerConfig q = find_preset("qwen3-30b-a3b").layer;
  CHECK(wide.smem_bytes(1) == 3 * 48 * 1024 + 64 * 1024 + 1024);
  TileConfig four = wide;
  four.stages = 4;  // four stages and the staging buffer exceed the shared memory
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up_wgrad, q, four, Arch::sm_90a}).find("shared memory") != std::string::npos);
  for (KernelFamily f : {KernelFamily::gate_up, KernelFamily::down_dgrad})
    CHECK(legality_problem(KernelSpec{f, q, wide, Arch::sm_90a}).find("weight gradients") != std::string::npos);
  // The per-slot outputs take it with TMA loads, no clusters, and (down_proj) no expert biases.
  for (KernelFamily f : {KernelFamily::down_proj, KernelFamily::gate_up_dgrad}) {
    CHECK(legality_problem(KernelSpec{f, q, wide, Arch::sm_90a}).empty());
    CHECK(legality_problem(KernelSpec{f, q, one, Arch::sm_90a}).find("_tmacontig") != std::string::npos);
  }
  LayerConfig biased = q;
  biased.expert_bias = true;
  CHECK(legality_problem(KernelSpec{KernelFamily::down_proj, biased, wide, Arch::sm_90a}).find("biases") != std::string::npos);
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up_dgrad, biased, wide, Arch::sm_90a}).empty());
  TileConfig multistage = wgmma_tile(128, 128, 3);
  multistage.tma_store = true;
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up_wgrad, q, multistage, Arch::sm_90a}).find("warp-specialised") !=
        std::string::npos);
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      const std::vector<KernelSpec> specs{{KernelFamily::gate_up_wgrad, p.layer, wide, Arch::sm_90a},
                                          {KernelFamily::down_wgrad, p.layer, wide, Arch::sm_90a},
                                          {KernelFamily::gate_up_wgrad, p.layer, narrow, Arch::sm_90a},
                                          {KernelFamily::down_wgrad, p.layer, one, Arch::sm_90a},
                                          {KernelFamily::down_proj, p.layer, wide, Arch::sm_90a},
                                          {KernelFamily::gate_up_dgrad, p.layer, wide, Arch::sm_90a}};
      for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), legality_problem(s));
      const auto built = compile_all(specs, 0, true);
      check_compiled_without_spills(built);
      for (const auto& b : built) {
        INFO(b.compiled.kernel_name);
        CHECK(b.generated.source.text.find("__grid_constant__") != std::string::npos);
        CHECK(b.compiled.ptx.find("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group") != std::string::npos);
        // bf16 gradient accumulation adds the staged tile into the existing gradient in L2
        const KernelFamily f = b.generated.spec.family;
        if (f == KernelFamily::gate_up_wgrad || f == KernelFamily::down_wgrad)
          CHECK(b.compiled.ptx.find("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group") !=
                std::string::npos);
        CHECK(b.compiled.ptx.find("cp.async.bulk.commit_group") != std::string::npos);
        CHECK(b.compiled.ptx.find("cp.async.bulk.wait_group") != std::string::npos);
        CHECK(b.compiled.ptx.find("fence.proxy.async.shared::cta") != std::string::npos);
        CHECK(b.compiled.ptx.find("wgmma.mma_async.sync.aligned.m64n") != std::string::npos);
      }
    }
  }
}

TEST_CASE("generator: _tmastore64 tiles (64-column staging blocks) keep the fourth stage and compile for every TMA-store family") {
  TileConfig t = wgmma_tile(128, 256, 4, Mainloop::persistent);
  t.tma_contiguous = t.tma_store = t.tma_store_blocks = true;
  CHECK(t.to_string() == "128x256x64_w8x1_s4_persist_tmacontig_tmastore64");
  CHECK(TileConfig::parse(t.to_string()) == t);
  CHECK_THROWS_AS(TileConfig::parse("128x256x64_w8x1_s4_persist_tmacontig_tmastore6"), InvalidArgument);
  // two [128][64] bf16 blocks: 32 KiB beside four 48 KiB stages, under the 227 KiB a block may have
  CHECK(t.smem_bytes(1) == 4 * 48 * 1024 + 32 * 1024 + 1024);
  TileConfig whole = t;
  whole.tma_store_blocks = false;  // the whole-tile staging buffer does not fit beside four stages
  const LayerConfig q = find_preset("qwen3-30b-a3b").layer;
  CHECK(legality_problem(KernelSpec{KernelFamily::down_proj, q, whole, Arch::sm_90a}).find("shared memory") != std::string::npos);
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      std::vector<KernelSpec> specs;
      for (KernelFamily f : {KernelFamily::gate_up_wgrad, KernelFamily::down_wgrad, KernelFamily::down_proj,
                             KernelFamily::gate_up_dgrad})
        specs.push_back({f, p.layer, t, Arch::sm_90a});
      for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), legality_problem(s));
      const auto built = compile_all(specs, 0, true);
      check_compiled_without_spills(built);
      for (const auto& b : built) {
        INFO(b.compiled.kernel_name);
        CHECK(b.compiled.ptx.find("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group") != std::string::npos);
        // a block's buffer is rewritten once only the newest group may still read the other one
        CHECK(b.compiled.ptx.find("cp.async.bulk.wait_group.read 1") != std::string::npos);
      }
    }
  }
  // 192 wide: three blocks a tile, so a tile's first block waits for every read of the previous
  // tile's last (the same buffer, the newest group).
  TileConfig odd = t;
  odd.bn = 192;
  const auto built = compile_all({KernelSpec{KernelFamily::down_proj, find_preset("gpt-oss-20b").layer, odd, Arch::sm_90a}}, 0, true);
  check_compiled_without_spills(built);
  REQUIRE(built.size() == 1);
  CHECK(built[0].compiled.ptx.find("cp.async.bulk.wait_group.read 0") != std::string::npos);
  const auto even = compile_all({KernelSpec{KernelFamily::down_proj, find_preset("gpt-oss-20b").layer, t, Arch::sm_90a}}, 0, true);
  REQUIRE(even.size() == 1);
  CHECK(even[0].compiled.ptx.find("cp.async.bulk.wait_group.read 0") == std::string::npos);
}

TEST_CASE("generator: _directarrive tiles (cp.async arrivals on the full barrier) compile for every expert GEMM") {
  auto direct = [](TileConfig t) {
    t.direct_arrive = true;
    return t;
  };
  const LayerConfig q = find_preset("qwen3-30b-a3b").layer;
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up, q, direct(wgmma_tile(128, 128, 3)), Arch::sm_90a})
            .find("warp-specialised") != std::string::npos);
  TileConfig pair = direct(wgmma_tile(128, 256, 4, Mainloop::persistent));
  pair.tma_contiguous = true;
  pair.cluster_m = 2;
  CHECK(legality_problem(KernelSpec{KernelFamily::down_proj, q, pair, Arch::sm_90a}).find("clusters") != std::string::npos);
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      std::vector<KernelSpec> specs;
      int kernel_layer = 0;  // the kernel layer's defaults load both operands by TMA: no cp.async arrivals
      for (const KernelSpec& d : layer_kernel_specs(p.layer, Arch::sm_90a, 0)) {
        if (!supports_persistent(d.family) || !d.tile.warp_specialized()) continue;
        if (d.tile.cute) {
          ++kernel_layer;
          continue;
        }
        TileConfig single = d.tile;  // a cluster pair's producer polls (deepseek-v3's gate_up): its single block
        single.cluster_m = 1;
        specs.push_back({d.family, p.layer, direct(single), Arch::sm_90a});
      }
      REQUIRE(specs.size() + kernel_layer >= 6);
      for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), legality_problem(s));
      const auto built = compile_all(specs, 0, true);
      check_compiled_without_spills(built);
      for (const auto& b : built) {
        INFO(b.compiled.kernel_name);
        // copies arrive on the full barrier; no landed-barrier polling; the consumers' proxy fence
        CHECK(b.compiled.ptx.find("cp.async.mbarrier.arrive.noinc") != std::string::npos);
        CHECK(b.compiled.ptx.find("mbarrier.test_wait") == std::string::npos);
        CHECK(b.compiled.ptx.find("fence.proxy.async.shared::cta") != std::string::npos);
      }
    }
  }
}

TEST_CASE("generator: the other tile order compiles for every expert GEMM and round-trips its names") {
  TileConfig multistage = wgmma_tile(128, 128, 3);
  multistage.alt_order = true;
  TileConfig persist_tma = wgmma_tile(128, 256, 4, Mainloop::persistent);
  persist_tma.tma_contiguous = true;
  persist_tma.alt_order = true;
  CHECK(multistage.to_string() == "128x128x64_w8x1_s3_wgmma_altorder");
  CHECK(persist_tma.to_string() == "128x256x64_w8x1_s4_persist_tmacontig_altorder");
  CHECK(TileConfig::parse("128x128x64_w8x1_s3_wgmma_altorder") == multistage);
  CHECK(TileConfig::parse("128x256x64_w8x1_s4_persist_tmacontig_altorder") == persist_tma);
  CHECK_THROWS_AS(TileConfig::parse("128x256x64_w8x1_s4_altorder"), InvalidArgument);
  CHECK_THROWS_AS(TileConfig::parse("128x256x64_w8x1_s4_ws_altorder_tmacontig"), InvalidArgument);
  const LayerConfig l = find_preset("mixtral-8x7b").layer;
  TileConfig router = wgmma_tile(128, 64, 4);
  router.alt_order = true;
  CHECK(legality_problem(KernelSpec{KernelFamily::router_logits, l, router, Arch::sm_90a}) ==
        "the other tile order (_altorder) is for wgmma tiles of the expert GEMMs");
  std::vector<KernelSpec> specs;
  for (KernelFamily f : {KernelFamily::gate_up, KernelFamily::down_proj, KernelFamily::down_dgrad,
                         KernelFamily::down_wgrad, KernelFamily::gate_up_wgrad, KernelFamily::gate_up_dgrad}) {
    TileConfig t = f == KernelFamily::gate_up ? wgmma_tile(128, 128, 4, Mainloop::persistent) : wgmma_tile(128, 256, 4, Mainloop::warp_specialized);
    t.tma_contiguous = f == KernelFamily::gate_up;  // the default gate_up (the cp.async _persist one spills, see above)
    t.alt_order = true;
    specs.push_back({f, l, t, Arch::sm_90a});
    REQUIRE_MESSAGE(legality_problem(specs.back()).empty(), legality_problem(specs.back()));
  }
  const auto built = compile_all(specs, 0, true);
  check_compiled_without_spills(built);
}

TEST_CASE("generator: ping-pong tiles compile for every expert GEMM of every suite shape, order their mainloops with named barriers") {
  auto tma = [](TileConfig t, bool store = false) {
    t.tma_contiguous = true;
    t.tma_store = store;
    return t;
  };
  const TileConfig p128 = tma(pingpong_tile(128, 128, 6));
  CHECK(p128.to_string() == "128x128x64_w4x1_s6_pingpong_tmacontig");
  CHECK(TileConfig::parse("128x128x64_w4x1_s6_pingpong_tmacontig") == p128);
  CHECK(p128.pingpong());
  CHECK(p128.persistent());
  CHECK(p128.threads() == 384);  // two consumer warpgroups and the producer
  const TileConfig store = tma(pingpong_tile(128, 128, 4), true);
  CHECK(store.smem_bytes(1) == 4 * 32 * 1024 + 2 * 32 * 1024 + 1024);  // a staging buffer per consumer group
  const LayerConfig q = find_preset("qwen3-30b-a3b").layer;
  CHECK(legality_problem(KernelSpec{KernelFamily::down_proj, q, tma(pingpong_tile(256, 128, 3)), Arch::sm_90a})
            .find("ping-pong tiles have bm 64 or 128") != std::string::npos);
  TileConfig wide_warps = p128;
  wide_warps.warps_m = 8;
  CHECK(legality_problem(KernelSpec{KernelFamily::down_proj, q, wide_warps, Arch::sm_90a}).find("4 x 1 warps") !=
        std::string::npos);
  CHECK(legality_problem(KernelSpec{KernelFamily::router_logits, q, pingpong_tile(128, 64, 4), Arch::sm_90a})
            .find("expert GEMMs") != std::string::npos);
  // 128x256 a warpgroup would hold 256 accumulators a thread.
  CHECK(legality_problem(KernelSpec{KernelFamily::down_proj, q, tma(pingpong_tile(128, 256, 4)), Arch::sm_90a})
            .find("accumulator registers") != std::string::npos);
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      std::vector<KernelSpec> specs;
      for (KernelFamily f : {KernelFamily::gate_up, KernelFamily::down_proj, KernelFamily::down_dgrad,
                             KernelFamily::gate_up_dgrad, KernelFamily::gate_up_wgrad, KernelFamily::down_wgrad}) {
        const int nb = stacked_b_tiles(f, p.layer.activation);
        const bool wgrad = f == KernelFamily::gate_up_wgrad || f == KernelFamily::down_wgrad;
        // 128 rows a warpgroup (two m64 slabs; the gated up-projection's fused W1|W3
        // instruction split over two accumulator arrays) and 64 rows with 256 columns.
        specs.push_back({f, p.layer, wgrad ? store : tma(pingpong_tile(128, 128 / nb, 6)), Arch::sm_90a});
        if (f == KernelFamily::gate_up || f == KernelFamily::down_proj)
          specs.push_back({f, p.layer, tma(pingpong_tile(64, 256 / nb, 5)), Arch::sm_90a});
      }
      for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), s.tile.to_string(), legality_problem(s));
      const auto built = compile_all(specs, 0, true);
      check_compiled_without_spills(built);
      for (const auto& b : built) {
        INFO(b.compiled.kernel_name);
        const std::string& ptx = b.compiled.ptx;
        // The mainloop turn: group 1 hands it to group 0 first, each group passes it on after
        // issuing its tile's last k step, and waits for it before its own.
        CHECK(std::regex_search(ptx, std::regex(R"(bar\.arrive %r\d+, %r\d+;)")));
        CHECK(std::regex_search(ptx, std::regex(R"(bar\.sync %r\d+, %r\d+;)")));
        CHECK(ptx.find("setmaxnreg.inc.sync.aligned.u32") != std::string::npos);
        CHECK(ptx.find("setmaxnreg.dec.sync.aligned.u32") != std::string::npos);
        CHECK(ptx.find("wgmma.mma_async.sync.aligned.m64n") != std::string::npos);
        CHECK(ptx.find("mbarrier.try_wait.parity") != std::string::npos);
      }
    }
  }
}

TEST_CASE("generator: cluster pairs (_cluster2x1) compile for the slot-tiled expert GEMMs of every suite shape and multicast their weight stages") {
  auto pair = [](TileConfig t) {
    t.tma_contiguous = true;
    t.cluster_m = 2;
    return t;
  };
  const TileConfig coop = pair(wgmma_tile(128, 256, 4, Mainloop::persistent));
  CHECK(coop.to_string() == "128x256x64_w8x1_s4_persist_tmacontig_cluster2x1");
  CHECK(TileConfig::parse("128x256x64_w8x1_s4_persist_tmacontig_cluster2x1") == coop);
  CHECK(TileConfig::parse("64x256x64_w4x1_s5_pingpong_tmacontig_cluster2x1") == pair(pingpong_tile(64, 256, 5)));
  const LayerConfig q = find_preset("qwen3-30b-a3b").layer;
  CHECK(KernelSpec{KernelFamily::down_proj, q, coop, Arch::sm_90a}.cluster_size() == 2);
  CHECK(KernelSpec{KernelFamily::gate_grad, q, coop, Arch::sm_90a}.cluster_size() == 1);  // down_dgrad's tile, no GEMM
  for (KernelFamily f : {KernelFamily::gate_up_wgrad, KernelFamily::down_wgrad})
    CHECK(legality_problem(KernelSpec{f, q, coop, Arch::sm_90a}).find("not the weight gradients") != std::string::npos);
  TileConfig one = wgmma_tile(128, 256, 4, Mainloop::warp_specialized);
  one.tma_contiguous = true;
  one.cluster_m = 2;
  CHECK(legality_problem(KernelSpec{KernelFamily::down_proj, q, one, Arch::sm_90a}).find("persistent TMA") != std::string::npos);
  CHECK(legality_problem(KernelSpec{KernelFamily::gate_up_dgrad, q, pair(wgmma_tile(128, 192, 4, Mainloop::persistent)), Arch::sm_90a})
            .find("multiple of 128") != std::string::npos);
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      std::vector<KernelSpec> specs;
      for (KernelFamily f : {KernelFamily::gate_up, KernelFamily::down_proj, KernelFamily::down_dgrad,
                             KernelFamily::gate_up_dgrad}) {
        const int nb = stacked_b_tiles(f, p.layer.activation);
        specs.push_back({f, p.layer, pair(wgmma_tile(128, 256 / nb, 4, Mainloop::persistent)), Arch::sm_90a});
        if (f != KernelFamily::down_dgrad) specs.push_back({f, p.layer, pair(pingpong_tile(64, 256 / nb, 5)), Arch::sm_90a});
      }
      for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), s.tile.to_string(), legality_problem(s));
      const auto built = compile_all(specs, 0, true);
      check_compiled_without_spills(built);
      for (const auto& b : built) {
        INFO(b.compiled.kernel_name);
        const std::string& ptx = b.compiled.ptx;
        CHECK(ptx.find("multicast::cluster") != std::string::npos);     // the shared weight stage
        CHECK(ptx.find("barrier.cluster.arrive") != std::string::npos);  // barriers exist before remote arrives
        CHECK(ptx.find("barrier.cluster.wait") != std::string::npos);
        CHECK(ptx.find("mapa.shared::cluster") != std::string::npos);  // a stage freed in both blocks
        CHECK(ptx.find("fence.mbarrier_init.release.cluster") != std::string::npos);
      }
    }
  }
}

TEST_CASE("generator: 256-row warp-specialised tiles (two m64 slabs a warpgroup) for down_proj, gate_up_dgrad and the weight gradients") {
  const TileConfig persist = wgmma_tile(256, 128, 4, Mainloop::persistent);
  CHECK(persist.warps_m == 8);  // two consumer warpgroups
  CHECK(persist.threads() == 256 + 128);
  CHECK(wgmma_tile(256, 128, 4, Mainloop::wgmma_multistage).warps_m == 16);  // no producer: a slab a warp
  LayerConfig q = find_preset("qwen3-30b-a3b").layer;
  TileConfig four_groups = persist;
  four_groups.warps_m = 16;
  CHECK(legality_problem(KernelSpec{KernelFamily::down_proj, q, four_groups, Arch::sm_90a}).find("warpgroups") !=
        std::string::npos);
  // Each warp's 16-row blocks of the two slabs, over both warpgroups, cover the 256 rows once
  // (NVRTC evaluates gemm::Tile::acc_row; the one-slab tiles keep their layout).
  KernelSource src;
  src.kernel_name = "acc_rows";
  src.file_name = "acc_rows.cu";
  src.text = R"(#include "moeblaze/gemm/tile.cuh"
template <class T>
constexpr bool rows_once() {
  bool seen[T::BM / 16] = {};
  for (int w = 0; w < T::WARPS_M; ++w)
    for (int mt = 0; mt < T::MT; ++mt) {
      const int r = T::acc_row(w, mt);
      if (r % 16 || r < 0 || r >= T::BM || seen[r / 16]) return false;
      seen[r / 16] = true;
    }
  return true;
}
using P = moeblaze::Mainloop;
using TwoSlabs = moeblaze::gemm::Tile<256, 128, 64, 8, 1, 4, 1, int(P::persistent), 1>;
using OneSlab = moeblaze::gemm::Tile<128, 256, 64, 8, 1, 4, 1, int(P::persistent), 1>;
using PingPong = moeblaze::gemm::Tile<128, 128, 64, 4, 1, 6, 1, int(P::pingpong), 1>;
static_assert(TwoSlabs::MT == 2 && rows_once<TwoSlabs>(), "256-row tile rows");
static_assert(TwoSlabs::acc_row(4, 0) == 128 && TwoSlabs::acc_row(3, 1) == 112, "warpgroup 1 owns rows 128..255");
static_assert(OneSlab::MT == 1 && rows_once<OneSlab>() && OneSlab::acc_row(5, 0) == 80, "cooperative rows");
static_assert(PingPong::MT == 2 && rows_once<PingPong>() && PingPong::acc_row(1, 1) == 80, "ping-pong rows");
extern "C" __global__ void acc_rows() {}
)";
  CHECK_NOTHROW(compile_kernel(src, CompileOptions{}));
  for (const Preset& p : presets()) {
    if (!p.in_suite) continue;
    SUBCASE(p.name.c_str()) {
      TileConfig down = persist, dgrad = wgmma_tile(256, 128, 4, Mainloop::warp_specialized);
      down.tma_contiguous = dgrad.tma_contiguous = true;
      // weight gradients: a gathered 128-wide B stage serves 256 rows (half the gathered loads
      // per FLOP of 128x256), the MN-major A slabs by TMA, the TMA-store epilogue at 3 stages
      TileConfig wgrad = wgmma_tile(256, 128, 3, Mainloop::persistent);
      wgrad.tma_contiguous = wgrad.tma_store = true;
      const std::vector<KernelSpec> specs{{KernelFamily::down_proj, p.layer, down, Arch::sm_90a},
                                          {KernelFamily::gate_up_dgrad, p.layer, dgrad, Arch::sm_90a},
                                          {KernelFamily::gate_up_wgrad, p.layer, wgrad, Arch::sm_90a},
                                          {KernelFamily::down_wgrad, p.layer, wgrad, Arch::sm_90a}};
      for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), legality_problem(s));
      const auto built = compile_all(specs, 0, true);  // keep the PTX
      check_compiled_without_spills(built);
      for (const auto& b : built) {
        INFO(b.compiled.kernel_name);
        CHECK(b.compiled.kernel_name.find("_256x128x64_w8x1_s") != std::string::npos);
        CHECK(b.compiled.ptx.find("wgmma.mma_async.sync.aligned.m64n128k16") != std::string::npos);
        CHECK(b.compiled.ptx.find("cp.async.bulk.tensor.2d") != std::string::npos);
      }
    }
  }
}

TEST_CASE("generator: the kernel layer (_cute) runs the six expert GEMMs on one skeleton: legality, shared memory, and each family compiles without spills") {
  auto cute_tile = [](TileConfig t, int cluster) {
    t.tma_contiguous = t.tma_store = t.cute = true;
    t.cluster_m = cluster;
    return t;
  };
  const TileConfig pp = cute_tile(pingpong_tile(128, 128, 6), 1);
  CHECK(pp.to_string() == "128x128x64_w4x1_s6_pingpong_tmacontig_tmastore_cute");
  CHECK(pp.threads() == 384);
  const LayerConfig ds = find_preset("deepseek-v3").layer;
  const LayerConfig q = find_preset("qwen3-30b-a3b").layer;
  auto spec = [](KernelFamily f, const LayerConfig& l, const TileConfig& t) { return KernelSpec{f, l, t, Arch::sm_90a}; };
  // Shared memory per family: stages of (bm + accumulator columns) x 64, the epilogue's staging,
  // 2 KiB of barriers and alignment (sm90/gemm_kernel.cuh kernel_smem_bytes).
  CHECK(kernel_layer_smem_bytes(spec(KernelFamily::down_proj, ds, pp)) == 6 * 32 * 1024 + 32 * 1024 + 2048);
  const TileConfig gu = cute_tile(pingpong_tile(128, 64, 5), 1);  // 128 x (2 x 64): W1 | W3 stacked
  CHECK(kernel_layer_accumulator_cols(spec(KernelFamily::gate_up, q, gu)) == 128);
  // gate_up: H, then h, in one staging tile of the accumulator's size.
  CHECK(kernel_layer_smem_bytes(spec(KernelFamily::gate_up, q, gu)) == 5 * 32 * 1024 + 32 * 1024 + 2048);
  // QuACK's gate_up tile, 128 x (2 x 96): 32-column boxes for H's parts and h, four stages.
  const TileConfig gu96 = cute_tile(pingpong_tile(128, 96, 4), 1);
  CHECK(kernel_layer_accumulator_cols(spec(KernelFamily::gate_up, q, gu96)) == 192);
  CHECK(kernel_layer_smem_bytes(spec(KernelFamily::gate_up, q, gu96)) == 4 * 40 * 1024 + 48 * 1024 + 2048);
  CHECK(legality_problem(spec(KernelFamily::gate_up, q, gu96)).empty());
  CHECK(legality_problem(spec(KernelFamily::down_proj, q, cute_tile(pingpong_tile(128, 96, 4), 1))).find("bn must be") !=
        std::string::npos);
  const TileConfig dd = cute_tile(pingpong_tile(128, 128, 4), 1);  // H's A and B, hg: three staging tiles
  CHECK(kernel_layer_smem_bytes(spec(KernelFamily::down_dgrad, q, dd)) == 4 * 32 * 1024 + 3 * 32 * 1024 + 1024 + 2048);
  const TileConfig wg = cute_tile(wgmma_tile(128, 128, 5, Mainloop::persistent), 1);
  CHECK(kernel_layer_smem_bytes(spec(KernelFamily::down_wgrad, q, wg)) == 5 * 32 * 1024 + 32 * 1024 + 2048);
  // The weight gradients stage two [bm][64] blocks in turn, whatever bn: four stages of 128 x 256.
  const TileConfig wg4 = cute_tile(wgmma_tile(128, 256, 4, Mainloop::persistent), 1);
  CHECK(kernel_layer_smem_bytes(spec(KernelFamily::gate_up_wgrad, q, wg4)) == 4 * 48 * 1024 + 32 * 1024 + 2048);
  CHECK(legality_problem(spec(KernelFamily::gate_up_wgrad, q, wg4)).empty());
  // What the parts cannot run, each with its reason.
  auto why = [&](KernelFamily f, const LayerConfig& l, const TileConfig& t) { return legality_problem(spec(f, l, t)); };
  CHECK(why(KernelFamily::router_logits, ds, pp).find("does not run router_logits") != std::string::npos);
  TileConfig loads = pp;
  loads.tma_store = false;
  CHECK(why(KernelFamily::down_proj, ds, loads).find("_tmacontig_tmastore") != std::string::npos);
  CHECK(why(KernelFamily::down_proj, ds, cute_tile(pingpong_tile(128, 128, 7), 1)).find("shared memory") != std::string::npos);
  CHECK(why(KernelFamily::down_proj, ds, cute_tile(pingpong_tile(128, 256, 3), 1)).find("accumulator registers") != std::string::npos);
  CHECK(why(KernelFamily::gate_up, q, pp).find("accumulator registers") != std::string::npos);  // 2 x 128 a warpgroup
  // gate_up's pair: each block loads W1's or W3's rows of the N tile, multicast.
  CHECK(why(KernelFamily::gate_up, q, cute_tile(pingpong_tile(128, 96, 4), 2)).empty());
  // down_wgrad's pair shares hg (TMA); gate_up_wgrad's B is the gathered x: no pair.
  const TileConfig wgrad_pair = cute_tile(wgmma_tile(256, 128, 3, Mainloop::persistent), 2);
  CHECK(why(KernelFamily::down_wgrad, q, wgrad_pair).empty());
  CHECK(why(KernelFamily::gate_up_wgrad, q, wgrad_pair).find("cluster pairs") != std::string::npos);
  // down_dgrad's pair faulted on an H100 (illegal address on three suite shapes): refused.
  CHECK(why(KernelFamily::down_dgrad, q, cute_tile(pingpong_tile(128, 128, 4), 2)).find("cluster pairs") != std::string::npos);
  CHECK(why(KernelFamily::down_wgrad, q, cute_tile(wgmma_tile(128, 64, 5, Mainloop::persistent), 2)).find("bn 128 or 256") !=
        std::string::npos);
  CHECK(why(KernelFamily::down_dgrad, q, cute_tile(pingpong_tile(128, 128, 5), 1)).find("shared memory") != std::string::npos);
  LayerConfig biased = ds;
  biased.expert_bias = true;
  CHECK(why(KernelFamily::down_proj, biased, pp).find("biases") != std::string::npos);
  CHECK(why(KernelFamily::gate_up, biased, gu).find("biases") != std::string::npos);
  LayerConfig plain = q;
  plain.activation = Activation::silu;
  CHECK(why(KernelFamily::gate_up, plain, gu).find("gated") != std::string::npos);
  LayerConfig odd_n = ds;
  odd_n.shape.ffn = 2048 + 32;
  CHECK(why(KernelFamily::gate_up_dgrad, odd_n, pp).find("n % 64") != std::string::npos);
  // The ragged weight-gradient loads take whole tiles only (a tile past the extent faulted).
  CHECK(why(KernelFamily::gate_up_wgrad, odd_n, wg).find("G n % bm") != std::string::npos);  // 4160 rows
  LayerConfig straddle = ds;
  straddle.shape.ffn = 2048 + 64;
  // A row tile straddling dW1 | dW3 is stored in 64-row pieces, each inside one matrix (a
  // whole-tile store to dW3 from a negative row faulted on an H100): legal where n % 64 == 0,
  // in both weight layouts, and the few-slot default takes the layer's tile there too.
  CHECK(why(KernelFamily::gate_up_wgrad, straddle, wg).empty());
  LayerConfig straddle256 = ds;
  straddle256.shape.ffn = 2048 + 128;  // G n % 256 == 0, n % 256 == 128
  CHECK(why(KernelFamily::gate_up_wgrad, straddle256, cute_tile(wgmma_tile(256, 128, 3, Mainloop::persistent), 1)).empty());
  LayerConfig odd_piece = ds;
  odd_piece.shape.ffn = 2048 + 32;  // G n % 64 == 0, but a 64-row piece would straddle too
  CHECK(why(KernelFamily::gate_up_wgrad, odd_piece, cute_tile(pingpong_tile(64, 128, 4), 1)).find("n % 64") !=
        std::string::npos);
  for (const int n : {320, 1344, 2048 + 64}) {
    LayerConfig few = find_preset("qwen3-30b-a3b").layer;  // few slots an expert, d % 256 == 0
    few.shape.ffn = n;
    for (const WeightLayout layout : {WeightLayout::separate, WeightLayout::fused_gate_up}) {
      few.weight_layout = layout;
      INFO("n = " << n);
      const TileConfig def = default_tile(KernelFamily::gate_up_wgrad, few, Arch::sm_90a, 4096);
      CHECK(def.cute);
      CHECK(why(KernelFamily::gate_up_wgrad, few, def).empty());
      const GeneratedKernel k = generate(spec(KernelFamily::gate_up_wgrad, few, def));
      CHECK(k.source.text.find("moeblaze/sm90/wgrad.cuh") != std::string::npos);
    }
  }
  LayerConfig whole = ds;
  whole.shape.ffn = 2048 + 128;
  CHECK(why(KernelFamily::gate_up_wgrad, whole, wg).empty());  // n % 128 == 0: no tile straddles
  LayerConfig narrow = q;
  narrow.shape.ffn = 128;
  CHECK(why(KernelFamily::down_wgrad, narrow, cute_tile(wgmma_tile(128, 256, 3, Mainloop::persistent), 1)).find("n % bn") !=
        std::string::npos);
  CHECK(why(KernelFamily::down_wgrad, narrow, wg).empty());
  const GeneratedKernel g = generate(spec(KernelFamily::down_proj, ds, pp));
  CHECK(g.source.needs_cutlass);
  CHECK(g.source.text.find("moeblaze/sm90/down_proj.cuh") != std::string::npos);
  // Only kernel-layer kernels include CUTLASS (and key their binaries on its release):
  // mixtral-8x7b's gate_up_wgrad (many slots an expert) is hand-written, deepseek-v3's (few) is not.
  const LayerConfig mx = find_preset("mixtral-8x7b").layer;
  CHECK_FALSE(generate(spec(KernelFamily::gate_up_wgrad, mx, default_tile(KernelFamily::gate_up_wgrad, mx, Arch::sm_90a)))
                  .source.needs_cutlass);
  CHECK(generate(spec(KernelFamily::gate_up_wgrad, ds, default_tile(KernelFamily::gate_up_wgrad, ds, Arch::sm_90a)))
            .source.needs_cutlass);
  CHECK(generate(spec(KernelFamily::down_proj, ds, default_tile(KernelFamily::down_proj, ds, Arch::sm_90a))).source.needs_cutlass);

  // Every family, ping-pong and cooperative, and the cluster pairs of the families whose B comes
  // by TMA alone (each
  // kernel-layer kernel compiles for tens of seconds on two cores: a few tiles each).
  const TileConfig coop = cute_tile(wgmma_tile(128, 256, 3, Mainloop::persistent), 1);
  std::vector<KernelSpec> specs = {
      spec(KernelFamily::gate_up, q, gu),
      spec(KernelFamily::gate_up, q, gu96),
      spec(KernelFamily::gate_up, ds, cute_tile(pingpong_tile(128, 96, 4), 2)),  // a pair: W1 | W3 multicast
      spec(KernelFamily::gate_up, ds, cute_tile(wgmma_tile(128, 64, 5, Mainloop::persistent), 1)),  // cooperative 128 x (2 x 64)
      spec(KernelFamily::down_proj, ds, pp),
      spec(KernelFamily::down_proj, ds, cute_tile(pingpong_tile(128, 128, 6), 2)),
      spec(KernelFamily::down_proj, ds, coop),
      // gpt-oss-20b's n = 2880: a last column tile of 64, whose H loads issue the boxes that start
      // inside n only (a box starting past it faulted on the GPU: sm90/staging.cuh live_boxes)
      spec(KernelFamily::down_dgrad, find_preset("gpt-oss-20b").layer, dd),
      spec(KernelFamily::down_wgrad, q, wg),
      // QuACK's down_wgrad tile: 256 gathered dy columns a block, hg's stages multicast in a pair
      spec(KernelFamily::down_wgrad, q, cute_tile(wgmma_tile(256, 128, 3, Mainloop::persistent), 2)),
      spec(KernelFamily::gate_up_wgrad, whole, wg),  // n = 2176: dW1 and dW3 in whole 128-row tiles
      spec(KernelFamily::gate_up_wgrad, ds, cute_tile(wgmma_tile(128, 256, 3, Mainloop::persistent), 1)),
      spec(KernelFamily::gate_up_dgrad, ds, pp),
      spec(KernelFamily::gate_up_dgrad, ds, cute_tile(wgmma_tile(128, 256, 3, Mainloop::persistent), 2)),
  };
  for (const auto& s : specs) REQUIRE_MESSAGE(legality_problem(s).empty(), s.tile.to_string(), legality_problem(s));
  const auto built = compile_all(specs, 0, true);
  check_compiled_without_spills(built);
  std::set<KernelFamily> families;
  for (const auto& b : built) {
    INFO(b.compiled.kernel_name);
    const KernelFamily f = b.generated.spec.family;
    families.insert(f);
    const std::string& ptx = b.compiled.ptx;
    // One skeleton: each family's kernel is sm90::gemm_kernel's code (PTX names the files its
    // code comes from, -lineinfo), none of the hand-written mainloops'.
    CHECK(ptx.find("moeblaze/sm90/gemm_kernel.cuh") != std::string::npos);
    CHECK(ptx.find("moeblaze/sm90/mainloop.cuh") != std::string::npos);
    CHECK(ptx.find("moeblaze/gemm/mainloop") == std::string::npos);
    CHECK(ptx.find("moeblaze/expert_gemms.cuh") == std::string::npos);
    CHECK(ptx.find("wgmma.mma_async.sync.aligned.m64n") != std::string::npos);
    if (f != KernelFamily::down_dgrad) CHECK(ptx.find("stmatrix.sync.aligned") != std::string::npos);
    CHECK(ptx.find("setmaxnreg.inc.sync.aligned.u32") != std::string::npos);
    const bool pair = b.generated.spec.tile.cluster_m == 2;
    CHECK((ptx.find(".multicast::cluster") != std::string::npos) == pair);
    // The pair's consumers release the partner's stages with CTA-scope arrivals (no GPU-wide
    // fence a k step).
    CHECK(ptx.find("fence.acq_rel.gpu") == std::string::npos);
    // Gathered operands: the producer warpgroup's cp.async copies arrive on the full barrier
    // and the consumers order them before the wgmmas' reads.
    const bool gathered = family_def(f).gathered();
    CHECK((ptx.find("cp.async.mbarrier.arrive.noinc") != std::string::npos) == gathered);
    CHECK((ptx.find("cp.async.cg.shared.global") != std::string::npos) == gathered);
    CHECK(ptx.find("fence.proxy.async.shared::cta") != std::string::npos);
    // Outputs leave by TMA: stores, or reduce-adds (the weight gradients' accumulation).
    CHECK(ptx.find("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group") != std::string::npos);
    const bool wgrad = f == KernelFamily::down_wgrad || f == KernelFamily::gate_up_wgrad;
    CHECK((ptx.find("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add") != std::string::npos) == wgrad);
    // down_dgrad loads its tile's H by TMA (3-D ragged boxes), prefetched into L2 first.
    if (f == KernelFamily::down_dgrad) {
      CHECK(ptx.find("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes") != std::string::npos);
      CHECK(ptx.find("cp.async.bulk.prefetch.tensor.3d.L2.global") != std::string::npos);
    }
  }
  CHECK(families.size() == 6);
}
