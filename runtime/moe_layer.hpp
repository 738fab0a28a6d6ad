// The MoE layer: validation, memory plan, forward and backward launches on the caller's
// stream. No device-to-host synchronisation inside forward or backward (unless the caller
// asks for the routing check), no allocation: the caller owns every byte
// (CUTLASS-style: memory_plan -> provide buffers -> forward/backward).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_driver.hpp"
#include "generator/layer_config.hpp"
#include "kernel_set.hpp"

namespace moeblaze {

enum class CheckpointMode {
  save_h,     // keep H = [A|B] and the index arrays; recompute only elementwise work
  recompute,  // keep the index arrays only; recompute the up-projection in backward
};
std::string to_string(CheckpointMode m);
CheckpointMode parse_checkpoint_mode(const std::string& s);  // "save-h" | "recompute"

enum class DType { bf16, f32, i32 };
std::string to_string(DType t);

// A device tensor as the layer sees it: pointer, element type, shape (row-major, dense).
struct TensorRef {
  CUdeviceptr ptr = 0;
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
  bool present() const { return ptr != 0; }
};

// Bytes a call needs, for a token count and checkpoint mode.
struct MemoryPlan {
  size_t saved_bytes = 0;             // held from forward to backward (the "act" memory)
  size_t forward_scratch_bytes = 0;   // transient during forward
  size_t backward_scratch_bytes = 0;  // transient during backward
  size_t h_floor_bytes = 0;           // 2*T*K*n*b (gated) or T*K*n*b: the H floor (docs/performance.md)
  size_t index_bytes = 0;             // the index arrays alone
};

struct ForwardArgs {
  TensorRef x;             // [T,d] bf16
  TensorRef topk_ids;      // [T,K] i32 (no built-in router)
  TensorRef topk_weights;  // [T,K] f32 (no built-in router); keep alive until backward
  TensorRef w_router;      // [E,d] bf16 (built-in router)
  TensorRef router_bias;   // [E] f32, optional (sigmoid router)
  TensorRef w1, w3, w2;    // [E,n,d], [E,n,d] (gated only), [E,d,n] bf16; a fused gate_up
                           // layer: w1 [E,2n,d] holds W1 and W3, w3 absent
  TensorRef bias_up;       // layers with expert biases: [E, G*n] bf16 ([gate | up] per expert)
  TensorRef bias_down;     // layers with expert biases: [E, d] bf16
  TensorRef y;             // [T,d] bf16 out
  TensorRef gates_out;     // [T,K] f32, optional: the built-in router's gates
  CheckpointMode mode = CheckpointMode::save_h;
  CUdeviceptr saved = 0;   // memory_plan().saved_bytes, caller-owned, kept until backward (which consumes it)
  size_t saved_bytes = 0;
  CUdeviceptr scratch = 0;  // memory_plan().forward_scratch_bytes
  size_t scratch_bytes = 0;
  // Synchronise after the index build and throw InvalidArgument("topk_ids") if an id is
  // outside [0,E) or repeated within a token. Off by default: it is a host sync.
  bool check_routing = false;
  LaunchObserver* observer = nullptr;  // optional: sees every launch (timing)
};

// What forward leaves for backward. Plain value; refers to the caller's saved buffer.
struct ForwardState {
  LayerConfig layer;
  int64_t tokens = 0;
  CheckpointMode mode = CheckpointMode::save_h;
  CUdeviceptr saved = 0;
  size_t saved_bytes = 0;
  uint64_t layer_id = 0;  // the MoeLayer that wrote it
  bool complete = false;
  // Views into the saved buffer.
  CUdeviceptr expert_token_indices = 0, expert_token_offsets = 0, token_expert_indices = 0,
              token_index_map = 0, tile_prefix = 0, expert_counts = 0, status = 0, H = 0;
};

struct BackwardArgs {
  TensorRef dy;            // [T,d] bf16
  TensorRef x;             // forward's inputs, unchanged
  TensorRef topk_weights;  // (no built-in router)
  TensorRef w_router, router_bias;
  TensorRef w1, w3, w2;
  TensorRef bias_up, bias_down;  // layers with expert biases (bias_up: recompute mode's up-projection)
  TensorRef dx;             // [T,d] bf16 out
  TensorRef dw1, dw3, dw2;  // bf16 (overwritten, or added to with `accumulate`) or f32 (results
                            // added: a main gradient); fused gate_up: dw1 [E,2n,d], dw3 absent
  TensorRef d_topk_weights;  // [T,K] f32 out (no built-in router: required; built-in: optional)
  TensorRef dw_router;       // [E,d] bf16 or f32 (built-in router)
  TensorRef d_bias_up, d_bias_down;  // layers with expert biases: the dtype of dw1, stored or added as it
  CUdeviceptr scratch = 0;   // memory_plan().backward_scratch_bytes
  size_t scratch_bytes = 0;
  // bf16 weight gradients: add the results into dw1/dw3/dw2 in the GEMM epilogues (gradient
  // accumulation over micro-batches) instead of overwriting them. f32 gradients always add.
  bool accumulate = false;
  LaunchObserver* observer = nullptr;  // optional: sees every launch (timing)
};

// The shape of w1 (and dw1): [E,n,d], or [E,2n,d] for a fused gate_up.
std::vector<int64_t> w1_shape(const LayerConfig& layer);

// Slot chunks of the forward's up and down projections (1 = one pass): layers whose h is
// wider than the model (n > d) run up to 4 chunks so that h is held one chunk at a time.
int forward_chunks(const LayerConfig& layer);
// Columns of hg per backward chunk of down dgrad + down wgrad (n: one pass).
int backward_chunk_cols(const LayerConfig& layer);

// The memory a call needs; dgrad_bn is the N tile of the down-dgrad kernel (its gate
// partials are one float per slot and N tile).
MemoryPlan plan_memory(const LayerConfig& layer, int64_t tokens, CheckpointMode mode, int dgrad_bn);
// The step's peak of the bytes a call adds to the caller's tensors: what forward keeps, the
// larger scratch, and the outputs y [T,d] and (with a backward) dx [T,d]. Weights, their
// gradients and x are excluded: they exist with or without the layer.
size_t peak_bytes(const MemoryPlan& plan, const LayerConfig& layer, int64_t tokens, bool backward = true);
// Argument checks of forward/backward: throw InvalidArgument naming the argument. They read
// no device memory, so they run (and are tested) without a GPU.
void validate_forward_args(const LayerConfig& layer, int dgrad_bn, const ForwardArgs& args);
void validate_backward_args(const LayerConfig& layer, int dgrad_bn, const ForwardState& state,
                            const BackwardArgs& args);

class MoeLayer {
 public:
  // `kernels` must be loaded (KernelSet::load) in the current context.
  explicit MoeLayer(std::shared_ptr<const KernelSet> kernels);
  // Compiles (NVRTC) and loads every kernel of `layer` with default tiles.
  static MoeLayer build(const LayerConfig& layer, Arch arch);

  const LayerConfig& config() const { return kernels_->layer(); }
  const KernelSet& kernels() const { return *kernels_; }
  MemoryPlan memory_plan(int64_t tokens, CheckpointMode mode) const;

  ForwardState forward(const ForwardArgs& args, CUstream stream) const;
  // Consumes a save-h state: the saved H is overwritten with dH (peak memory), so each
  // forward's state takes one backward; run forward again for another.
  void backward(const ForwardState& state, const BackwardArgs& args, CUstream stream) const;

  // Reads the status word the index build left (synchronises the stream).
  RoutingStatus routing_status(const ForwardState& state, CUstream stream) const;

 private:
  int dgrad_bn() const;
  std::shared_ptr<const KernelSet> kernels_;
  uint64_t id_;
};

}  // namespace moeblaze
