// End-to-end check of the layer on a GPU against the CPU reference: random inputs (never
// zeros), poisoned outputs (every element must be written), two runs compared bitwise,
// and relative errors (Frobenius) of every output on sampled tokens and experts.
// Library code: the CLI (forward-check, grad-check) and the GPU tests call it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "runtime/moe_layer.hpp"

namespace moeblaze {

// How topk ids are drawn when the caller provides the routing (router = none).
enum class RoutingDistribution {
  random,    // K distinct experts per token, uniformly
  skewed,    // a few hot experts (E/16, at least 1) carry 4x the mean load
  balanced,  // token t picks experts (t*K + j) mod E
  one_hot,   // every token picks experts 0..K-1 (all tokens on the same K experts)
};
std::string to_string(RoutingDistribution r);
RoutingDistribution parse_routing(const std::string& s);

struct LayerCheckOptions {
  LayerConfig layer;
  int64_t tokens = 0;
  CheckpointMode mode = CheckpointMode::save_h;
  RoutingDistribution routing = RoutingDistribution::random;  // used when layer.router == none
  bool backward = true;
  uint64_t seed = 1;
  int sample_tokens = 256;  // tokens compared with the reference (all when T is smaller)
  int sample_experts = 3;   // experts whose weight gradients are compared
  double tolerance = 1e-2;
  bool accumulate_fp32 = false;  // weight gradients into fp32 buffers (added to their contents)
  // Kernels from this cache instead of compiled now: its tuned tiles (tuned) or only its
  // binaries of the default and forced tiles (!tuned).
  KernelCache* cache = nullptr;
  bool tuned = true;
  std::string policy;  // tuning policy for the lookup (measurement_policy)
  std::map<KernelFamily, TileConfig> force;  // these families run with these tiles
  // Caller routing only: (slot, id) pairs whose id the GPU gets outside [0, E), with the
  // routing check off and a NaN gate (a left-out slot's gate must never be read). The check
  // then expects those slots left out: the index arrays of build_index_left_out, the outputs
  // and gradients of the reference without them (their gate 0: the same y, dx and weight
  // gradients), their d_topk_weights exactly 0, and the tokens that had them compared on
  // their own lines. The sampled tokens include those tokens.
  std::vector<std::pair<int64_t, int32_t>> bad_ids;
};

struct ErrorLine {
  std::string name;
  double rel_error = 0;  // ||got-ref|| / ||ref||
  int64_t elements = 0;  // elements compared
  bool exact = false;    // integer data compared for equality (rel_error 0 or 1)
};

struct LayerCheckResult {
  std::string layer, device;
  int64_t tokens = 0;
  std::vector<ErrorLine> errors;
  bool all_written = true;         // no poison left in any output
  std::string unwritten;           // which output had poison left
  bool bitwise_identical = true;   // second run equals the first, every output
  std::string differs;             // which output differed
  double forward_ms = 0, backward_ms = 0;  // second run, CUDA events
  MemoryPlan plan;
  size_t peak_bytes = 0;  // saved + larger scratch + y + dx (weights, grads and x excluded)
  std::vector<int64_t> expert_counts_min_max;  // min, max tokens per expert
  std::string kernels;                         // which kernels ran (load report)
  double max_error() const;
  bool passed(double tolerance) const;
};

// Runs the check on the current device (a DeviceContext must be current).
LayerCheckResult run_layer_check(const LayerCheckOptions& options);

}  // namespace moeblaze
