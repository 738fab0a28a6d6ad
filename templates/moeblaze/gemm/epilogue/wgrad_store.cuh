// The weight gradients' register epilogue (GradOutput): bf16 stores, fp32 adds into the caller's
// main gradient, or bf16 adds into the gradient already there (accumulation over micro-batches,
// no separate add kernel). Rows are expert-local output rows; row_out(r) gives the start of row
// r of the output matrix.
#pragma once
#include "moeblaze/gemm/fragment.cuh"

namespace moeblaze::gemm {

// Bytes of one weight-gradient element for a GradOutput.
MB_DEV int grad_bytes(int grad_output) { return grad_output == static_cast<int>(GradOutput::add_f32) ? 4 : 2; }

template <class Cfg, class RowOut>
MB_DEV void store_wgrad(const float (&acc)[1][Cfg::MT][Cfg::NT][4], int m_valid, int n_valid,
                        int n0, int grad_output, RowOut row_out) {
  gemm::for_each_pair<Cfg>(acc, [&](int r, int c, float v0, float v1) {
    if (r >= m_valid || c >= n_valid) return;
    void* row = row_out(r);
    if (grad_output == static_cast<int>(GradOutput::add_f32)) {
      float* o = static_cast<float*>(row) + n0 + c;
      o[0] += v0;
      o[1] += v1;
    } else if (grad_output == static_cast<int>(GradOutput::add_bf16)) {
      // Each output element belongs to one thread of one tile: a plain read-add-write.
      bf16_t* o = static_cast<bf16_t*>(row) + n0 + c;
      const float2 old = load_bf16x2(o);
      store_bf16x2(o, old.x + v0, old.y + v1);
    } else {
      store_bf16x2(static_cast<bf16_t*>(row) + n0 + c, v0, v1);
    }
  });
}

}  // namespace moeblaze::gemm
