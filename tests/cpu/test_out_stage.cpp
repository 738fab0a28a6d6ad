// The TMA-store epilogue's staging layout (templates/moeblaze/gemm/epilogue/out_stage.cuh), checked on
// the host: every element of the tile has its own place, and one warp-wide write of the
// wgmma accumulator layout hits 32 different banks.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "moeblaze/gemm/epilogue/out_stage.cuh"

namespace {

template <int BM, int BN>
void check_layout() {
  std::vector<int> seen(BM * BN, 0);
  for (int r = 0; r < BM; ++r)
    for (int c = 0; c < BN; c += 2) {  // the epilogue writes column pairs
      const int o = moeblaze::gemm::staged_offset<BM>(r, c);
      REQUIRE(o >= 0);
      REQUIRE(o + 1 < BM * BN);
      CHECK(o % 2 == 0);
      CHECK(moeblaze::gemm::staged_offset<BM>(r, c + 1) == o + 1);
      ++seen[o];
      ++seen[o + 1];
    }
  for (int v : seen) REQUIRE(v == 1);
  // A warp write: rows r0 + lane/4, columns c0 + 2*(lane%4) (c0 a multiple of 8), 4 bytes each.
  for (int r0 = 0; r0 < BM; r0 += 8)
    for (int c0 = 0; c0 < BN; c0 += 8) {
      std::vector<int> banks;
      for (int lane = 0; lane < 32; ++lane)
        banks.push_back((moeblaze::gemm::staged_offset<BM>(r0 + lane / 4, c0 + 2 * (lane % 4)) * 2 / 4) % 32);
      std::sort(banks.begin(), banks.end());
      CHECK(std::unique(banks.begin(), banks.end()) == banks.end());
    }
}

}  // namespace

TEST_CASE("out_stage: the staging layout covers the tile once and a warp's writes are conflict-free") {
  check_layout<128, 256>();
  check_layout<128, 128>();
  check_layout<64, 256>();
}

TEST_CASE("out_stage: each 64-column block is one [BM][64] box in the 128-byte swizzle") {
  // Block j starts BM*64 elements after block j-1 (a whole box); inside it, row r is 128 bytes
  // and its chunk c sits at c ^ (r & 7): rows 0 and 8 keep chunk order, row 1 swaps neighbours.
  CHECK(moeblaze::gemm::staged_offset<128>(0, 64) == 128 * 64);
  CHECK(moeblaze::gemm::staged_offset<128>(3, 130) == 2 * 128 * 64 + 3 * 64 + ((0 ^ 3) << 3) + 2);
  CHECK(moeblaze::gemm::staged_offset<128>(8, 17) == 8 * 64 + 16 + 1);
  CHECK(moeblaze::gemm::staged_offset<128>(1, 0) == 64 + 8);
}

TEST_CASE("out_stage: the fp32 slab layout covers 64 rows once, in [64][32] boxes, at most 2-way bank conflicts") {
  using moeblaze::gemm::staged_offset_f32;
  constexpr int BN = 256;
  std::vector<int> seen(64 * BN, 0);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < BN; c += 2) {  // float2 writes
      const int o = staged_offset_f32(r, c);
      REQUIRE(o >= 0);
      REQUIRE(o + 1 < 64 * BN);
      CHECK(o % 2 == 0);
      CHECK(staged_offset_f32(r, c + 1) == o + 1);
      ++seen[o];
      ++seen[o + 1];
    }
  for (int v : seen) REQUIRE(v == 1);
  // Box j (32 columns, 128 bytes a row) starts 64*32 floats after box j-1; chunk c of row r at c ^ (r & 7).
  CHECK(staged_offset_f32(0, 32) == 64 * 32);
  CHECK(staged_offset_f32(3, 37) == 64 * 32 + 3 * 32 + ((1 ^ 3) << 2) + 1);
  // 8-byte writes go by half-warps: lanes 16h..16h+15 = rows r0 + lane/4, columns c0 + 2*(lane%4).
  // A 128-byte fp32 row spans all 32 banks, and the swizzle pairs rows 2i, 2i+1 on the same two
  // chunks, so a half-warp's 128 bytes meet 2-way conflicts (the bf16 layout above has none); the
  // 128-byte swizzle is what the TMA box reads, and 2-way is the least it allows here.
  for (int r0 = 0; r0 < 64; r0 += 8)
    for (int c0 = 0; c0 < BN; c0 += 8)
      for (int h = 0; h < 2; ++h) {
        int per_bank[32] = {};
        for (int lane = 16 * h; lane < 16 * h + 16; ++lane) {
          const int o = staged_offset_f32(r0 + lane / 4, c0 + 2 * (lane % 4));
          ++per_bank[o % 32];
          ++per_bank[(o + 1) % 32];
        }
        CHECK(*std::max_element(per_bank, per_bank + 32) <= 2);
      }
}
