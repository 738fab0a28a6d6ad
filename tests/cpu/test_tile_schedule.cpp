// The expert GEMMs' tile schedules (templates/moeblaze/gemm/scheduler/tile_schedule.cuh) on the host:
// every output tile exactly once within the launched grid (family_tiles, as the runtime
// launches it), in both schedule orders.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "generator/family_def.hpp"
#include "moeblaze/gemm/scheduler/tile_schedule.cuh"

using namespace moeblaze;

namespace {

constexpr int E = 12, BM = 128, BN = 128, N_OUT = 1000, N_TILES = (N_OUT + BN - 1) / BN;

// The grid the runtime launches over M rows of `kind` and N_OUT (or `cols`) output columns.
long long launch_grid(RowKind kind, int64_t rows, int cols = N_OUT, bool slot_chunk = false) {
  GemmProblem p;
  p.m_kind = kind;
  p.rows = rows;
  p.cols = cols;
  p.batch = E;
  p.slot_chunk = slot_chunk;
  TileConfig t;
  t.bm = BM;
  t.bn = BN;
  return family_tiles(p, t);
}

struct Routing {
  std::vector<int> offsets;      // [E+1]
  std::vector<int> tile_prefix;  // [3][E+1], as the index build writes it
  int slots() const { return offsets.back(); }
};

Routing make_routing(unsigned seed) {
  std::mt19937 rng(seed);
  Routing r;
  r.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    const int c = e % 5 == 3 ? 0 : static_cast<int>(rng() % 700);  // some experts get nothing
    r.offsets[e + 1] = r.offsets[e] + c;
  }
  r.tile_prefix.assign(kTilePrefixRows * (E + 1), 0);
  for (int bm : {64, 128, 256}) {
    int* tp = r.tile_prefix.data() + tile_prefix_row(bm) * (E + 1);
    for (int e = 0; e < E; ++e) tp[e + 1] = tp[e] + (r.offsets[e + 1] - r.offsets[e] + bm - 1) / bm;
  }
  return r;
}

// (expert, slot0, n_tile) of every valid tile in [0, grid); checks rows and uniqueness.
template <class Decode>
std::vector<std::tuple<int, int, int>> walk(long long grid, Decode&& decode) {
  std::vector<std::tuple<int, int, int>> seen;
  for (int tile = 0; tile < grid; ++tile) {
    const gemm::SlotTile t = decode(tile);
    if (!t.valid) continue;
    seen.emplace_back(t.expert, t.slot0, t.n_tile);
  }
  return seen;
}

template <bool SWAP>
void check_slot_schedule(const Routing& r) {
  INFO("swap " << SWAP);
  const long long grid = launch_grid(RowKind::expert_slots, r.slots());
  std::set<std::tuple<int, int, int>> unique;
  int expected = 0;
  for (int e = 0; e < E; ++e) expected += (r.offsets[e + 1] - r.offsets[e] + BM - 1) / BM * N_TILES;
  const auto seen = walk(grid, [&](int tile) {
    const gemm::SlotTile t = gemm::slot_tile<BM, BN, E, N_OUT, SWAP>(tile, r.tile_prefix.data(), r.offsets.data());
    if (t.valid) {
      CHECK(t.rows >= 1);
      CHECK(t.rows <= BM);
      CHECK(t.slot0 + t.rows <= r.offsets[t.expert + 1]);
      CHECK((t.slot0 - r.offsets[t.expert]) % BM == 0);
      CHECK(t.n0 == t.n_tile * BN);
    }
    return t;
  });
  for (const auto& s : seen) CHECK(unique.insert(s).second);
  CHECK(static_cast<int>(seen.size()) == expected);
  // The order: inside an expert, consecutive tiles share the weight tile (default) or the
  // block of gathered rows (swapped).
  int same = 0, pairs = 0;
  for (size_t i = 1; i < seen.size(); ++i) {
    if (std::get<0>(seen[i]) != std::get<0>(seen[i - 1])) continue;
    ++pairs;
    same += SWAP ? std::get<1>(seen[i]) == std::get<1>(seen[i - 1]) : std::get<2>(seen[i]) == std::get<2>(seen[i - 1]);
  }
  CHECK(same * 2 > pairs);
}

template <bool SWAP>
void check_chunked_schedule(const Routing& r, int chunks) {
  INFO("swap " << SWAP << ", chunks " << chunks);
  const int TK = r.slots(), per = (TK + chunks - 1) / chunks;
  std::map<int, std::vector<int>> slots_per_n;  // n_tile -> how often each slot is covered
  for (int lo = 0; lo < TK; lo += per) {
    const int hi = std::min(TK, lo + per);
    const long long grid = launch_grid(RowKind::expert_slots, hi - lo, N_OUT, true);
    int valid = 0;
    for (int tile = 0; tile < grid + N_TILES * 4; ++tile) {  // past the grid: nothing more
      const gemm::SlotTile t = gemm::chunk_slot_tile<BM, BN, E, N_OUT, SWAP>(tile, r.offsets.data(), lo, hi);
      if (!t.valid) continue;
      CHECK(tile < grid);
      ++valid;
      CHECK(t.slot0 >= lo);
      CHECK(t.slot0 + t.rows <= hi);
      CHECK(t.slot0 + t.rows <= r.offsets[t.expert + 1]);
      auto& v = slots_per_n[t.n_tile];
      v.resize(TK, 0);
      for (int s = t.slot0; s < t.slot0 + t.rows; ++s) ++v[s];
    }
    CHECK(valid > 0);
  }
  CHECK(static_cast<int>(slots_per_n.size()) == N_TILES);
  for (const auto& [n, v] : slots_per_n)
    for (int s = 0; s < TK; ++s) CHECK(v[s] == 1);
}

template <bool SWAP>
void check_wgrad_schedule(const Routing& r) {
  constexpr int M = 700;
  const int TM = (M + BM - 1) / BM;
  const RoutingView rv{nullptr, r.offsets.data(), nullptr, nullptr, r.tile_prefix.data(), nullptr, 0};
  std::set<std::tuple<int, int, int>> unique;
  const int grid = static_cast<int>(launch_grid(RowKind::weight_rows, M));
  CHECK(grid == E * TM * N_TILES);
  for (int tile = 0; tile < grid + 5; ++tile) {
    const gemm::WgradTile w = gemm::wgrad_tile<BM, BN, E, M, N_OUT, SWAP>(tile, rv);
    CHECK(w.valid == (tile < grid));
    if (!w.valid) continue;
    CHECK(unique.insert({w.expert, w.m0, w.n0}).second);
    CHECK(w.m0 < M);
    CHECK(w.n0 < N_OUT);
    CHECK(w.slot0 == r.offsets[w.expert]);
    CHECK(w.count == r.offsets[w.expert + 1] - r.offsets[w.expert]);
  }
  CHECK(static_cast<int>(unique.size()) == grid);
  // Default: the side with fewer tiles (M here: 6 < 8) fastest; swapped: the other one.
  const gemm::WgradTile a = gemm::wgrad_tile<BM, BN, E, M, N_OUT, SWAP>(0, rv),
                        b = gemm::wgrad_tile<BM, BN, E, M, N_OUT, SWAP>(1, rv);
  CHECK((a.n0 == b.n0) == !SWAP);
}

}  // namespace

TEST_CASE("tile schedules: every tile once, in both orders (slot tiles, chunks, column chunks, weight gradients)") {
  for (unsigned seed : {1u, 2u, 3u}) {
    const Routing r = make_routing(seed);
    check_slot_schedule<false>(r);
    check_slot_schedule<true>(r);
    check_chunked_schedule<false>(r, 3);
    check_chunked_schedule<true>(r, 4);
    check_wgrad_schedule<false>(r);
    check_wgrad_schedule<true>(r);
    // A column chunk: N tiles [2, 5) only.
    std::set<std::pair<int, int>> cols;
    const long long grid = launch_grid(RowKind::expert_slots, r.slots(), 3 * BN);
    for (int tile = 0; tile < grid; ++tile) {
      const gemm::SlotTile t = gemm::slot_tile_cols<BM, BN, E, true>(tile, r.tile_prefix.data(), r.offsets.data(), 3, 2);
      if (!t.valid) continue;
      CHECK(t.n_tile >= 2);
      CHECK(t.n_tile < 5);
      CHECK(cols.insert({t.slot0, t.n_tile}).second);
    }
    int m_tiles = 0;
    for (int e = 0; e < E; ++e) m_tiles += (r.offsets[e + 1] - r.offsets[e] + BM - 1) / BM;
    CHECK(static_cast<int>(cols.size()) == m_tiles * 3);
  }
}
