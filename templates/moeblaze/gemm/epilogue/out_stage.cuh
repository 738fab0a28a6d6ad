// Where each output element goes in the staging buffer of a TMA-store epilogue
// (gemm/epilogue/tma_store.cuh): BN/64 blocks of [BM rows][64 columns], 16-byte chunk c of row r at
// chunk c ^ (r & 7) (the 128-byte swizzle a [BM][64] box of a CU_TENSOR_MAP_SWIZZLE_128B map
// reads). Host and device code: tests/cpu/test_out_stage.cpp checks it on the host.
#pragma once
#include "moeblaze/common.cuh"

namespace moeblaze::gemm {

// Offset of (row, col) in elements.
template <int BM>
MB_HD constexpr int staged_offset(int r, int c) {
  return (c >> 6) * (BM * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}

}  // namespace moeblaze::gemm
