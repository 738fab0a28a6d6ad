// The weight gradients' register epilogue: bf16 stores, or fp32 adds into the caller's
// gradient buffers (gradient accumulation). Rows are expert-local output rows; row_out(r) gives
// the start of row r of the output matrix.
#pragma once
#include "moeblaze/gemm/fragment.cuh"

namespace moeblaze::gemm {

template <class Cfg, class RowOut>
MB_DEV void store_wgrad(const float (&acc)[1][Cfg::MT][Cfg::NT][4], int m_valid, int n_valid,
                        int n0, int accumulate_fp32, RowOut row_out) {
  gemm::for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
    if (r >= m_valid || c >= n_valid) return;
    void* row = row_out(r);
    if (accumulate_fp32) {
      float* o = static_cast<float*>(row) + n0 + c;
      o[0] += v0;
      o[1] += v1;
    } else {
      store_bf16x2(static_cast<bf16_t*>(row) + n0 + c, v0, v1);
    }
  });
}

// dW2_e = sum over slots of gather(dy)^T (g h): M = D, N = N, both operands gathered along k.

}  // namespace moeblaze::gemm
