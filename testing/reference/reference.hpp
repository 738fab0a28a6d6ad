// CPU reference of the MoE layer, in double precision on bf16 inputs. It defines what
// the GPU kernels must compute; every GPU check compares against it. Functions take
// explicit subsets (tokens, experts) so that a check on a large shape can verify a
// sample of rows without computing the whole layer on the CPU.
//
// Conventions (the GPU follows the same):
//   x [T,d], W_r [E,d], W1/W3 [E,n,d], W2 [E,d,n], all bf16, row-major.
//   Slot (t,j), j < K, is token t's j-th pick; picks are ordered by descending
//   selection score, ties broken towards the lower expert id.
//   A = x_t W1_e^T (+ b_up[e, :n]), B = x_t W3_e^T (+ b_up[e, n:]) (n each);
//   h = act(A) * up(B) (gated; up(B) = B except clamped_swiglu) or act(A);
//   o = h W2_e^T (+ b_down[e]) (d); y_t = sum_j g_tj o_tj.
//   gelu is the tanh approximation: 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))).
//   clamped_swiglu (GPT-OSS): act(a) = m sigmoid(1.702 m), m = min(a, 7); up(b) = clamp(b, -7, 7) + 1.
#pragma once
#include <cstdint>
#include <vector>

#include "core/bf16.hpp"
#include "moeblaze/common.cuh"

namespace moeblaze::reference {

// ---- activations -------------------------------------------------------------------
double activation(Activation act, double a);             // act(a) (the gate part)
double activation_grad(Activation act, double a);        // d act / d a
double up_factor(Activation act, double b);              // up(b) (the W3 part of a gated activation)
double up_factor_grad(Activation act, double b);         // d up / d b

// ---- index structures (docs/design.md "Index arrays") ---------------------------
struct IndexArrays {
  std::vector<int32_t> expert_token_indices;  // T*K: token ids grouped by expert, ascending
  std::vector<int32_t> expert_token_offsets;  // E+1: exclusive prefix sum of counts
  std::vector<int32_t> token_expert_indices;  // T*K: token-major expert id of slot (t,j)
  std::vector<int32_t> token_index_map;       // T*K: position of slot (t,j) in expert_token_indices
};
// ids: [T*K] token-major. Throws std::invalid_argument naming "topk_ids" when an id is
// outside [0,E) or a token picks the same expert twice.
IndexArrays build_index(const int32_t* ids, int64_t T, int K, int E);
// The index arrays of ids that may lie outside [0,E) (the GPU's index build with its check
// off): such a slot is left out, kLeftOutSlot in token_expert_indices and token_index_map,
// and in no expert; expert_token_indices holds the expert_token_offsets[E] slots that are
// in, ascending per expert, and kLeftOutSlot after them. Throws like build_index on a token
// that picks one expert twice.
IndexArrays build_index_left_out(const int32_t* ids, int64_t T, int K, int E);

// ---- router -------------------------------------------------------------------------
struct RouterSpec {
  RouterKind kind = RouterKind::softmax_topk;
  bool renormalize = false;
  double route_scale = 1.0;
};
// logits[t*E + e] = sum_i x[t,i] W_r[e,i] for t in [0,T).
std::vector<double> router_logits(const bf16* x, const bf16* w_router, int64_t T, int d, int E);
struct Routing {
  std::vector<int32_t> ids;      // [T*K]
  std::vector<double> weights;   // [T*K] gates g_tj
};
// Top-K selection and gates from logits (bias: [E] or nullptr; used by sigmoid_topk only).
Routing route(const RouterSpec& spec, const double* logits, int64_t T, int E, int K,
              const float* bias);
// Gates for a given selection `ids` (which may come from the GPU): same formula as route,
// so that a near-tie picked differently on the GPU is still checked exactly.
std::vector<double> gates_for(const RouterSpec& spec, const double* logits, const int32_t* ids,
                              int64_t T, int E, int K);
// d logits [T*E] from the gate gradient d_gates [T*K] for the selection ids.
std::vector<double> router_logits_grad(const RouterSpec& spec, const double* logits,
                                       const int32_t* ids, const double* d_gates, int64_t T,
                                       int E, int K);

// ---- experts ------------------------------------------------------------------------
struct ExpertWeights {
  const bf16* w1 = nullptr;  // [E,n,d]
  const bf16* w3 = nullptr;  // [E,n,d], nullptr for plain activations
  const bf16* w2 = nullptr;  // [E,d,n]
  int E = 0, d = 0, n = 0;
  Activation act = Activation::swiglu;
  const bf16* b_up = nullptr;    // [E, G*n] or nullptr: [gate | up] biases of each expert
  const bf16* b_down = nullptr;  // [E, d] or nullptr
};

// Per-slot forward values for one token-expert pair.
struct SlotForward {
  std::vector<double> a, b, h;  // n each (b empty when not gated)
  std::vector<double> o;        // d
};
SlotForward slot_forward(const ExpertWeights& w, const bf16* x_row, int expert);

// y rows for the listed tokens: y[i*d + c] for tokens[i].
std::vector<double> forward_rows(const ExpertWeights& w, const bf16* x, const int32_t* ids,
                                 const double* gates, int K, const std::vector<int64_t>& tokens);

struct TokenGrads {
  std::vector<double> dx;       // [tokens.size() * d]: expert part of dx (router part excluded)
  std::vector<double> d_gates;  // [tokens.size() * K]: dL/dg for each of the token's slots
};
// Gradients for the listed tokens given dy [T,d] (bf16).
TokenGrads backward_rows(const ExpertWeights& w, const bf16* x, const bf16* dy, const int32_t* ids,
                         const double* gates, int K, const std::vector<int64_t>& tokens);

struct ExpertGrads {
  std::vector<double> dw1;  // [n*d]
  std::vector<double> dw3;  // [n*d] (empty when not gated)
  std::vector<double> dw2;  // [d*n]
  std::vector<double> d_bias_up;    // [G*n] (rows variant: [G*rows], gate rows then up rows); empty without biases
  std::vector<double> d_bias_down;  // [d]; empty without biases
};
// Weight gradients of one expert, summing over every slot (t,j) with ids[t*K+j] == expert.
ExpertGrads expert_weight_grads(const ExpertWeights& w, const bf16* x, const bf16* dy,
                                const int32_t* ids, const double* gates, int64_t T, int K,
                                int expert);

// The same gradients restricted to FFN indices `rows` (i in [0,n)): rows i of dW1 and dW3
// and columns i of dW2, returned compactly as dw1/dw3 [rows.size()*d] and dw2
// [d*rows.size()] (dw2[c*rows.size() + r] is dW2[c, rows[r]]). Costs about 5*d multiply-adds
// per slot and row instead of a whole expert's backward, so large experts can be checked.
ExpertGrads expert_weight_grad_rows(const ExpertWeights& w, const bf16* x, const bf16* dy,
                                    const int32_t* ids, const double* gates, int64_t T, int K,
                                    int expert, const std::vector<int>& rows);

// Router-part gradients: dx_router rows for the listed tokens ([tokens.size()*d]) and the
// full dW_r [E*d], from d logits [T*E].
std::vector<double> router_dx_rows(const double* dlogits, const bf16* w_router, int E, int d,
                                   const std::vector<int64_t>& tokens);
std::vector<double> router_weight_grad(const double* dlogits, const bf16* x, int64_t T, int E, int d);

// ---- comparison ---------------------------------------------------------------------
// ||got - ref||_F / ||ref||_F; +inf when got has a NaN/Inf or ref is all zero and got is not.
double relative_error(const double* got, const double* ref, size_t count);

}  // namespace moeblaze::reference
