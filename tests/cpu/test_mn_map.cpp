// The MN-major loader's thread layout (templates/moeblaze/gemm/mn_map.cuh), checked on the host:
// every chunk copied once, whole 128-byte lines per warp-wide copy, conflict-free stores.
#include <doctest/doctest.h>

#include <cstddef>
#include <map>
#include <set>
#include <utility>

#include "moeblaze/gemm/mn_map.cuh"

namespace {

template <int ROWS, int COLS, int THREADS>
void check_map() {
  using M = moeblaze::gemm::MnRowMap<ROWS, COLS, THREADS>;
  INFO("tile [" << ROWS << "][" << COLS << "], " << THREADS << " threads");
  std::map<std::pair<int, int>, int> copies;  // (row, col) -> times copied
  std::set<int> offsets;
  for (int t = 0; t < THREADS; ++t)
    for (int i = 0; i < M::R; ++i)
      for (int j = 0; j < M::G; ++j) {
        ++copies[{M::row(t, i), M::col(t, j)}];
        offsets.insert(M::offset(M::row(t, i), M::col(t, j)));
      }
  CHECK(copies.size() == std::size_t(ROWS * COLS / 8));  // every chunk of the tile ...
  for (const auto& [rc, n] : copies) CHECK(n == 1);  // ... exactly once
  CHECK(offsets.size() == std::size_t(ROWS * COLS / 8));   // to distinct shared-memory chunks
  for (int o : offsets) CHECK(o % 8 == 0);
  // Each warp-wide copy (one (i, j) for 32 threads): 4 whole 128-byte lines of global memory
  // (row, 64-column block), and each line's 8 chunks land in 8 distinct 16-byte bank groups.
  for (int w = 0; w < THREADS / 32; ++w)
    for (int i = 0; i < M::R; ++i)
      for (int j = 0; j < M::G; ++j) {
        std::map<std::pair<int, int>, std::set<int>> lines;  // (row, block) -> chunks
        std::map<std::pair<int, int>, std::set<int>> banks;
        for (int t = 32 * w; t < 32 * w + 32; ++t) {
          const int r = M::row(t, i), c = M::col(t, j);
          lines[{r, c / 64}].insert((c % 64) / 8);
          banks[{r, c / 64}].insert((M::offset(r, c) / 8) % 8);
        }
        CHECK(lines.size() == 4);
        for (const auto& [l, chunks] : lines) CHECK(chunks.size() == 8);
        for (const auto& [l, b] : banks) CHECK(b.size() == 8);
      }
}

}  // namespace

TEST_CASE("MN-major loader map: whole lines per warp copy, every chunk once, conflict-free") {
  check_map<64, 64, 128>();
  check_map<64, 128, 128>();
  check_map<64, 256, 128>();
  check_map<64, 64, 256>();
  check_map<64, 128, 256>();
  check_map<64, 256, 256>();
  using Wide = moeblaze::gemm::MnRowMap<64, 256, 128>;
  CHECK(Wide::R == 4);  // row indices per thread and stage of a [64][256] gathered tile
  CHECK(Wide::G == 4);
}
