// Where each output element goes in the staging buffer of a TMA-store epilogue
// (gemm/epilogue/tma_store.cuh): BN/64 blocks of [BM rows][64 columns], 16-byte chunk c of row r at
// chunk c ^ (r & 7) (the 128-byte swizzle a [BM][64] box of a CU_TENSOR_MAP_SWIZZLE_128B map
// reads). Host and device code: tests/cpu/test_out_stage.cpp checks both layouts on the host.
#pragma once
#include "moeblaze/common.cuh"

namespace moeblaze::gemm {

// Offset of (row, col) in elements.
template <int BM>
MB_HD constexpr int staged_offset(int r, int c) {
  return (c >> 6) * (BM * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}

// The fp32 staging of one 64-row slab (fp32 main gradients, reduce-added by TMA): BN/32 blocks
// of [64 rows][32 columns], 16-byte chunk c of row r at chunk c ^ (r & 7), what a [64][32] box of
// an fp32 CU_TENSOR_MAP_SWIZZLE_128B map reads. Offset in floats; r is the row inside the slab.
MB_HD constexpr int staged_offset_f32(int r, int c) {
  return (c >> 5) * (64 * 32) + r * 32 + ((((c >> 2) & 7) ^ (r & 7)) << 2) + (c & 3);
}

}  // namespace moeblaze::gemm
