// The GPU regression table: shape x tile kind x checkpoint mode. Each row is one grad-check
// of the layer against the CPU reference (tests/gpu/test_tile_table.cpp runs it); the CPU
// tests check that every row's tiles are legal for its shape (tests/cpu/test_tile_table.cpp),
// so a renamed or tightened tile breaks CI before it costs GPU time.
//
// A tile kind is a set of forced tiles (FAMILY=TILE, as `moeblaze grad-check --tile` takes
// them) or a rule over the default tiles; families the row's layer lacks are ignored, every
// other tiled family runs its default tile (forced as well), and gate_grad follows
// down_dgrad. The fast rows are one small-shape check per kind, on as few shapes as possible
// (the default kernels of a shape compile once); the full sweep adds the kind's other small
// shapes, every small row in both checkpoint modes, the suite presets per kind, and the
// mma.sync tiles.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "generator/kernel_spec.hpp"
#include "runtime/moe_layer.hpp"
#include "testing/layer_check.hpp"

namespace moeblaze::tables {

struct TableShape {
  std::string name;  // "E8 K2 d256 n128 T300" or a preset's name
  LayerConfig layer;
  int64_t tokens = 0;
  RoutingDistribution routing = RoutingDistribution::random;  // caller routing (router none)
  bool accumulate_fp32 = false;
};

struct TileKind {
  std::string name;
  std::string what;  // one line: which tiles, which families
  // The forced tiles for a layer and token count (empty: the default tiles).
  std::function<std::map<KernelFamily, TileConfig>(const LayerConfig&, int64_t tokens)> tiles;
};

struct TableRow {
  TileKind kind;
  TableShape shape;
  CheckpointMode mode = CheckpointMode::save_h;
  std::string name() const;  // "wsp / E64 K8 d256 n192 T1000 skewed / save-h"
};

// The fast rows (the default of `ctest -L gpu`) and the rows only the full sweep runs.
std::vector<TableRow> fast_rows();
std::vector<TableRow> sweep_rows();

// The layer-check options of a row: its layer, tokens, routing, mode and tiles.
LayerCheckOptions check_options(const TableRow& row);

}  // namespace moeblaze::tables
