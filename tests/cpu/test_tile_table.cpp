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
    // The specs the runtime builds for this row: defaults, the forced tiles, followers tied.
    std::vector<KernelSpec> specs = layer_kernel_specs(o.layer, "sm_90a", o.tokens);
    int forced = 0;
    for (KernelSpec& s : specs)
      if (auto it = o.force.find(s.family); it != o.force.end()) {
        s.tile = it->second;
        ++forced;
      }
    tie_following_tiles(specs);
    if (row.kind.name != "defaults") CHECK(forced > 0);
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
  CHECK(fast.size() >= 30);
  check_rows(fast, names);
  check_rows(sweep, names);
  // Every kind of the fast rows comes back in the sweep, in the other mode.
  std::set<std::string> fast_kinds, sweep_kinds;
  for (const auto& r : fast) fast_kinds.insert(r.kind.name);
  for (const auto& r : sweep) sweep_kinds.insert(r.kind.name);
  for (const auto& k : fast_kinds) CHECK(sweep_kinds.count(k) == 1);
}
