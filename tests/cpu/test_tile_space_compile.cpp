// The cost model's first pick of every expert GEMM compiles without spills, on the suite's
// shapes and on the held-out ones (bench/heldout.json): what a tune on a new shape times
// first must build. NVRTC only, no GPU.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "generator/cost_model.hpp"
#include "generator/tile_space.hpp"
#include "runtime/kernel_build.hpp"
#include "tuner/candidates.hpp"

using namespace moeblaze;

namespace {

struct Shape {
  std::string name;
  LayerConfig layer;
  int64_t tokens;
};

// The shapes of a bench JSON file ({"name": ..., "E": .., "K": .., "d": .., "n": .., "T": ..}).
std::vector<Shape> shapes_in(const std::string& file) {
  const std::string path = std::string(MOEBLAZE_SOURCE_DIR) + "/bench/" + file;
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.is_open(), path << " not found");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const std::regex row(
      R"re(\{"name":\s*"([^"]+)",\s*"E":\s*(\d+),\s*"K":\s*(\d+),\s*"d":\s*(\d+),\s*"n":\s*(\d+),\s*"T":\s*(\d+))re");
  std::vector<Shape> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), row); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    LayerConfig l;
    l.shape = {std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4]), std::stoi(m[5])};
    out.push_back({m[1], l, std::stoll(m[6])});
  }
  return out;
}

}  // namespace

TEST_CASE("tile space: the cost model's first pick of each expert GEMM compiles without spills on the suite and held-out shapes") {
  std::vector<Shape> shapes = shapes_in("suite.json");
  const std::vector<Shape> held_out = shapes_in("heldout.json");
  REQUIRE(shapes.size() == 6);
  REQUIRE(held_out.size() >= 6);
  shapes.insert(shapes.end(), held_out.begin(), held_out.end());
  std::vector<KernelSpec> specs;
  std::vector<std::string> what;
  for (const Shape& s : shapes)
    for (KernelFamily f : all_families()) {
      if (!has_cost_model(f)) continue;
      // The tuner's list: the default, then the model's first pick.
      const auto c = tile_candidates(f, s.layer, Arch::sm_90a, 2, s.tokens);
      REQUIRE_MESSAGE(c.size() == 2, s.name << " " << to_string(f));
      specs.push_back(KernelSpec{f, s.layer, c[1], Arch::sm_90a});
      what.push_back(s.name + " " + to_string(f) + " " + c[1].to_string());
    }
  const auto builds = build_kernels(specs, BuildOptions{});
  REQUIRE(builds.size() == specs.size());
  for (size_t i = 0; i < builds.size(); ++i) {
    INFO(what[i]);
    REQUIRE_MESSAGE(builds[i].kernel, builds[i].error_text());
    const ResourceReport& r = builds[i].kernel->compiled.resources;
    CHECK_MESSAGE(!r.has_spills(), r.stack_bytes << " bytes stack, " << r.spill_store_bytes << " spill stores");
  }
}

// The cooperative kernel-layer tiles that spilled 12-32 bytes on phi-3.5-moe (16 experts), where
// the same tiles compiled clean on the suite shapes: the consumers held the block's tile index,
// and a pair's rank, in registers across the persistent loop (sm90/gemm_kernel.cuh now reads them
// from the special registers where used). Phi-3.5-moe is a held-out shape: only spills are
// checked here, nothing of its speed.
TEST_CASE("tile space: phi-3.5-moe's cooperative gate_up and down_dgrad candidates compile without spills") {
  LayerConfig phi;
  phi.shape = {16, 2, 4096, 6400};
  const std::vector<std::pair<KernelFamily, std::string>> tiles = {
      {KernelFamily::gate_up, "128x128x64_w8x1_s3_persist_tmacontig_tmastore_cute"},
      {KernelFamily::gate_up, "128x128x64_w8x1_s3_persist_tmacontig_tmastore_cluster2x1_cute"},
      {KernelFamily::down_dgrad, "128x128x64_w8x1_s4_persist_tmacontig_tmastore_cute"},
  };
  std::vector<KernelSpec> specs;
  for (const auto& [f, tile] : tiles) specs.push_back(KernelSpec{f, phi, TileConfig::parse(tile), Arch::sm_90a});
  const auto builds = build_kernels(specs, BuildOptions{});
  REQUIRE(builds.size() == specs.size());
  for (size_t i = 0; i < builds.size(); ++i) {
    INFO(to_string(tiles[i].first) << " " << tiles[i].second);
    REQUIRE_MESSAGE(builds[i].kernel, builds[i].error_text());
    const ResourceReport& r = builds[i].kernel->compiled.resources;
    CHECK_MESSAGE(!r.has_spills(), r.stack_bytes << " bytes stack, " << r.spill_store_bytes << " spill stores");
  }
}
