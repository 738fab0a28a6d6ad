// Host checks of the kernel layer's hand-computed shared-memory positions and accumulator
// coordinates against CuTe's own layouts (templates/moeblaze/sm90/): where the gathered copies
// land in a stage (operand_gather.cuh), which accumulator values gate_up's epilogue pairs as
// A and B, which the down_dgrad and weight-gradient epilogues take as one row's column pair,
// and where the staging tiles' boxes start. A wrong position would put rows in the wrong place
// with no compile error, and only a GPU run would show it; here it fails without one.
// Compiled by nvcc for the host (and sm_90a, which the device code in the headers needs) and run
// by CTest (`kernel_layer_layouts`, label cpu).
#include <cstdio>
#include <cstdlib>

#include "moeblaze/sm90/down_dgrad.cuh"
#include "moeblaze/sm90/gate_up.cuh"
#include "moeblaze/sm90/wgrad.cuh"

using namespace moeblaze::sm90;
using namespace cute;

static int failures = 0, checks = 0;
#define EXPECT_EQ(a, b, ...)                                                  \
  do {                                                                        \
    ++checks;                                                                 \
    const long long va = (long long)(a), vb = (long long)(b);                 \
    if (va != vb && failures++ < 20) {                                        \
      std::printf("FAIL %s:%d: %s = %lld, expected %lld: ", __FILE__, __LINE__, #a, va, vb); \
      std::printf(__VA_ARGS__);                                               \
      std::printf("\n");                                                      \
    }                                                                         \
  } while (0)

// Swizzled layouts address by the pointer's bits: a 1024-byte-aligned base, as the kernels'.
alignas(1024) static Element stage_buf[2 * 256 * 64];
alignas(1024) static float f32_buf[256 * 128];


template <int ROWS>
void check_rows_k() {
  Tensor s = make_tensor(make_smem_ptr(stage_buf), StageLayout<Major::k, ROWS, 2>{});
  for (int ptid = 0; ptid < kGatherThreads; ++ptid)
    for (int i = 0; i < ROWS / 16; ++i)
      for (int st = 0; st < 2; ++st) {
        const int r = ptid / 8 + 16 * i, col = (ptid % 8) * 8;
        const long long got = gather_rows_k_offset(ptid) + i * 2048 + st * ROWS * 128;
        EXPECT_EQ(got, staging_offset(&s(r, col, st), stage_buf), "K-major %d rows, thread %d row %d", ROWS, ptid, r);
        for (int e = 1; e < 8; ++e)  // the chunk's 8 elements are one 16-byte copy
          EXPECT_EQ(staging_offset(&s(r, col + e, st), stage_buf), got + 2 * e, "K-major chunk contiguity");
      }
}

template <int ROWS>
void check_cols_mn() {
  using C = GatherColsMN::ThreadCopy<ROWS>;
  Tensor s = make_tensor(make_smem_ptr(stage_buf), StageLayout<Major::mn, ROWS, 2>{});  // (mn, k, stage)
  for (int ptid = 0; ptid < kGatherThreads; ++ptid)
    for (int j = 0; j < C::ROWS_PER; ++j)
      for (int b = 0; b < C::BLOCKS; ++b)
        for (int st = 0; st < 2; ++st) {
          const int kk = ptid / 8 + 16 * j, mn = b * 64 + (ptid % 8) * 8;
          const long long got = gather_cols_mn_offset(ptid) + j * 2048 + b * 8192 + st * ROWS * 128;
          EXPECT_EQ(got, staging_offset(&s(mn, kk, st), stage_buf), "MN-major %d rows, thread %d k %d block %d", ROWS, ptid, kk, b);
          for (int e = 1; e < 8; ++e)
            EXPECT_EQ(staging_offset(&s(mn + e, kk, st), stage_buf), got + 2 * e, "MN-major chunk contiguity");
          // Row j's index comes by a shuffle from a lane of the same warp that loaded the index
          // of k row kk.
          const int lane = gather_cols_mn_row_lane(ptid, j);
          EXPECT_EQ(lane >= 0 && lane < 32, true, "MN-major thread %d row %d: lane %d", ptid, j, lane);
          EXPECT_EQ(gather_cols_mn_index_row((ptid / 32) * 32 + lane), kk, "MN-major thread %d: index of k row %d", ptid, kk);
        }
}

// The accumulator coordinates the epilogues rely on, for one tile config.
template <class Cfg>
void check_accumulators() {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, NH = BN / 2;
  using HMma = typename Cfg::template TiledMmaN<NH>;
  for (int t = 0; t < Cfg::TILE_THREADS; ++t) {
    const auto c = typename Cfg::TiledMma{}.get_slice(t).partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
    const auto ch = HMma{}.get_slice(t).partition_C(make_identity_tensor(Shape<Int<BM>, Int<NH>>{}));
    static_assert(decltype(size<1>(c))::value == Cfg::WG_ROWS / 64, "M slabs per thread");
    for (int m = 0; m < int(size<1>(c)); ++m)
      for (int h = 0; h < 2; ++h) {
        const int row = get<0>(c(make_coord(make_coord(0, h, 0), m, 0)));
        for (int j = 0; j < BN / 8; ++j) {
          const auto a0 = c(make_coord(make_coord(0, h, j), m, 0)), a1 = c(make_coord(make_coord(1, h, j), m, 0));
          // down_dgrad, weight gradients: values 0 and 1 are columns c, c + 1 of one row, the
          // same row for every j; column blocks of 8 by j.
          EXPECT_EQ(get<0>(a0), row, "row of (h %d, j %d)", h, j);
          EXPECT_EQ(get<0>(a1), row, "row of the pair");
          EXPECT_EQ(get<1>(a1), get<1>(a0) + 1, "pair columns");
          EXPECT_EQ(get<1>(a0) / 8, j, "column block j");
          if (j < NH / 8) {  // gate_up: (v, j) and (v, j + NH / 8) are A and B of one h element
            const auto b0 = c(make_coord(make_coord(0, h, j + NH / 8), m, 0));
            EXPECT_EQ(get<0>(b0), row, "gate_up B row");
            EXPECT_EQ(get<1>(b0), get<1>(a0) + NH, "gate_up B column");
            const auto hh = ch(make_coord(make_coord(0, h, j), m, 0));
            EXPECT_EQ(get<0>(hh), row, "h row");
            EXPECT_EQ(get<1>(hh), get<1>(a0), "h column");
          }
        }
      }
  }
  // Staging boxes: [BM][64] each, one after the other; fp32 [BM][32] boxes likewise.
  Tensor sd = make_tensor(make_smem_ptr(stage_buf), StagingLayout<BM, BN>{});
  for (int b = 0; b < BN / 64; ++b)
    for (int r = 0; r < BM; r += 7)
      EXPECT_EQ(staging_offset(&sd(r, 64 * b), stage_buf) / (BM * 128), b, "staging box %d row %d", b, r);
  // The weight gradients' fp32 block: one [BM][32] box (128 bytes a row) in a bf16 block's bytes,
  // each row's 32 values in its own 128-byte line (the box's swizzle permutes 16-byte chunks).
  static_assert(WgradEpilogue<Cfg>::F32_BLOCK == 32 && WgradEpilogue<Cfg>::Block::BYTES == BM * 128, "one fp32 box a block");
  Tensor sf = make_tensor(make_smem_ptr(f32_buf), typename WgradEpilogue<Cfg>::F32Layout{});
  for (int r = 0; r < BM; r += 7) {
    for (int cc = 0; cc < 32; ++cc)
      EXPECT_EQ(staging_offset(&sf(r, cc), f32_buf) / 128, r, "fp32 block row %d column %d", r, cc);
    for (int cc = 0; cc < 32; cc += 2)  // an accumulator pair is one 8-byte store
      EXPECT_EQ(staging_offset(&sf(r, cc + 1), f32_buf), staging_offset(&sf(r, cc), f32_buf) + 4, "fp32 pair");
  }
}

int main() {
  check_rows_k<64>();
  check_rows_k<128>();
  check_rows_k<256>();
  check_cols_mn<64>();
  check_cols_mn<128>();
  check_cols_mn<256>();
  check_accumulators<KernelConfig<128, 128, 4, Schedule::pingpong>>();
  check_accumulators<KernelConfig<64, 256, 4, Schedule::pingpong>>();
  check_accumulators<KernelConfig<128, 256, 4, Schedule::cooperative>>();
  check_accumulators<KernelConfig<256, 128, 4, Schedule::cooperative>>();
  std::printf("kernel layer layouts: %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
