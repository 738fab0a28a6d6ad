// The GPU regression table without a GPU: every row names a valid layer and tiles that are
// legal for it and generate, and the rows are distinct. A tile renamed or made illegal for a
// shape fails here, in CI, instead of on the GPU machine.
#include <doctest/doctest.h>

#include <set>

#include "generator/heuristics.hpp"
#include "tables/tile_table.hpp"

using namespace moeblaze;

namespace {

void check_rows(const std::vector<tables::TableRow>& rows, std::set<std::string>& names) {
  for (const tables::TableRow& row : rows) {
    INFO(row.name());
    CHECK(names.insert(row.name()).second);
    const LayerCheckOptions o = tables::check_options(row);
    CHECK_NOTHROW(o.layer.validate());
    CHECK(o.tokens > 0);
    CHECK((o.layer.router == RouterKind::none || o.routing == RoutingDistribution::random));
    // The kind changes at least one family (the defaults kind none).
    CHECK(row.kind.tiles(o.layer, o.tokens).empty() == (row.kind.name == "defaults"));
    // The specs the runtime builds for this row: every tiled family forced, followers tied.
    std::vector<KernelSpec> specs = layer_kernel_specs(o.layer, Arch::sm_90a, o.tokens);
    for (KernelSpec& s : specs) {
      if (!is_tiled(s.family)) continue;
      REQUIRE(o.force.count(s.family) == 1);
      s.tile = o.force.at(s.family);
    }
    tie_following_tiles(specs);
    for (const KernelSpec& s : specs) {
      INFO(to_string(s.family), " ", s.tile.to_string());
      CHECK(legality_problem(s) == "");
      CHECK_NOTHROW(generate(s));
    }
  }
}

}  // namespace

TEST_CASE("gpu table: every row's tiles are legal for its shape and generate") {
  std::set<std::string> names;
  const auto fast = tables::fast_rows();
  const auto sweep = tables::sweep_rows();
  check_rows(fast, names);
  check_rows(sweep, names);
  // One fast row per kind, and every kind comes back in the sweep.
  std::set<std::string> fast_kinds, sweep_kinds;
  for (const auto& r : fast) CHECK(fast_kinds.insert(r.kind.name).second);
  for (const auto& r : sweep) sweep_kinds.insert(r.kind.name);
  CHECK(fast_kinds.size() >= 20);
  for (const auto& k : fast_kinds) CHECK(sweep_kinds.count(k) == 1);
}
