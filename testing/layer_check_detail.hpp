// Internal to the layer check (layer_check.cpp runs the layer, layer_check_compare.cpp
// compares what it wrote with the CPU reference): the data of one check, step by step.
#pragma once
#include <cstdint>
#include <vector>

#include "core/bf16.hpp"
#include "layer_check.hpp"
#include "runtime/cuda_driver.hpp"

namespace moeblaze::detail {

// Random host inputs (never zeros), scaled so that activations stay O(1); with fp32
// accumulation also the random contents the weight gradients are added to.
struct CheckInputs {
  std::vector<bf16> x, w1, w3, w2, dy, wr;
  std::vector<bf16> w13;             // fused gate_up only: each expert's W1 rows, then its W3 rows
  std::vector<bf16> b_up, b_down;    // expert biases only: [E, G*n], [E, d]
  std::vector<float> bias;           // sigmoid router only
  std::vector<int32_t> ids;          // caller routing only (with bad_ids: the reference's, all valid)
  std::vector<float> gates;          // caller routing only (with bad_ids: 0 at the left-out slots)
  std::vector<int32_t> device_ids;   // bad_ids only: what the GPU gets (ids outside [0, E) there)
  std::vector<float> device_gates;   // bad_ids only: NaN at the left-out slots
  std::vector<float> acc1, acc3, acc2, accr;  // fp32 accumulation only (acc1 is [E, w1_rows, d])
};

// The device copies of the inputs, the outputs, and the layer's saved state and scratch.
struct CheckBuffers {
  DeviceBuffer x, w1, w3, w2, dy, wr, bias, ids, gates_in, b_up, b_down;
  DeviceBuffer y, dx, dw1, dw3, dw2, dwr, dgates, gates_out, db_up, db_down;
  DeviceBuffer saved, fscratch, bscratch;
};

// Everything the comparison steps read.
struct CheckData {
  const LayerCheckOptions& options;
  int E, K, d, n;
  int64_t T;
  bool gated, router;
  // A fused gate_up layer reads W1 and W3 from one [E,2n,d] tensor and writes dW1/dW3 the same
  // way (no separate W3); the reference keeps them apart. w1_rows: rows of W1 per expert.
  bool fused, separate_w3;
  size_t w1_rows;
  CheckInputs in;
  CheckBuffers buf;
  ForwardState state;
};

// Each compares one group of outputs and appends its lines to res (layer_check_compare.cpp).
// The index arrays and counts: exact. Returns the GPU's picks (token_expert_indices).
std::vector<int32_t> compare_index_arrays(const CheckData& c, LayerCheckResult& res);
// The built-in router's gates and picks; returns the reference gates of the GPU's picks
// (the caller's gates without a router) and fills `logits` (router only).
std::vector<double> compare_router(const CheckData& c, const std::vector<int32_t>& ids, std::vector<double>& logits,
                                   LayerCheckResult& res);
// The tokens compared with the reference: all when T is small, else a sample with the first
// and last in.
std::vector<int64_t> sample_tokens(const CheckData& c);
void compare_forward(const CheckData& c, const std::vector<int32_t>& ids, const std::vector<double>& gates,
                     const std::vector<int64_t>& tokens, LayerCheckResult& res);
void compare_backward(const CheckData& c, const std::vector<int32_t>& ids, const std::vector<double>& gates,
                      const std::vector<double>& logits, const std::vector<int64_t>& tokens, LayerCheckResult& res);

}  // namespace moeblaze::detail
