#include "moe_layer.hpp"

#include <fmt/format.h>

#include <atomic>

#include "layer_buffers.hpp"
#include "moeblaze/kernel_args.cuh"
#include "tma.hpp"

namespace moeblaze {
using namespace detail;
namespace {

constexpr int kRouterWarpsPerBlock = 8;  // router.cuh WARPS_PER_BLOCK

std::atomic<uint64_t> next_layer_id{1};

template <class T>
T* dptr(CUdeviceptr base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}
template <class T>
T* dptr(const TensorRef& t) {
  return reinterpret_cast<T*>(t.ptr);
}

int dtype_bytes(DType t) { return t == DType::bf16 ? 2 : 4; }

// W3 (or dW3): its own tensor, or in a fused gate_up the rows n..2n of w1's first expert
// (the kernels step 2n rows per expert from there).
const void* second_part(const LayerConfig& l, const TensorRef& w1, const TensorRef& w3) {
  if (!l.fused_gate_up()) return reinterpret_cast<const void*>(w3.ptr);
  return reinterpret_cast<const void*>(w1.ptr + static_cast<CUdeviceptr>(l.shape.ffn) * l.shape.hidden *
                                                    dtype_bytes(w1.dtype));
}

}  // namespace

std::string to_string(CheckpointMode m) { return m == CheckpointMode::save_h ? "save-h" : "recompute"; }

CheckpointMode parse_checkpoint_mode(const std::string& s) {
  if (s == "save-h") return CheckpointMode::save_h;
  if (s == "recompute") return CheckpointMode::recompute;
  throw InvalidArgument("mode", fmt::format("'{}' is not one of save-h, recompute", s));
}

std::string to_string(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
  }
  return "unknown";
}

MoeLayer::MoeLayer(std::shared_ptr<const KernelSet> kernels) : kernels_(std::move(kernels)), id_(next_layer_id++) {
  if (!kernels_ || !kernels_->loaded()) throw Error("MoeLayer needs a loaded KernelSet");
}

MoeLayer MoeLayer::build(const LayerConfig& layer, Arch arch) {
  auto set = std::make_shared<KernelSet>(KernelSet::compile(layer, arch));
  set->load();
  return MoeLayer(std::move(set));
}

int MoeLayer::dgrad_bn() const { return kernels_->get(KernelFamily::down_dgrad).generated.spec.tile.bn; }

MemoryPlan MoeLayer::memory_plan(int64_t tokens, CheckpointMode mode) const {
  return plan_memory(config(), tokens, mode, dgrad_bn());
}

ForwardState MoeLayer::forward(const ForwardArgs& a, CUstream stream) const {
  validate_forward_args(config(), dgrad_bn(), a);
  const LayerConfig& l = config();
  const int E = l.shape.experts, K = l.shape.topk;
  const int64_t T = a.x.shape[0], TK = T * K;
  const LaunchExtent step{.tokens = T};
  const SavedLayout sl(l, T, a.mode);
  const ForwardScratch fs(l, T);
  const KernelSet& ks = *kernels_;
  const CudaDriver& drv = cuda_driver();

  ForwardState st;
  st.layer = l;
  st.tokens = T;
  st.mode = a.mode;
  st.saved = a.saved;
  st.saved_bytes = sl.total;
  st.layer_id = id_;
  st.expert_token_indices = a.saved + sl.eti;
  st.expert_token_offsets = a.saved + sl.eto;
  st.token_expert_indices = a.saved + sl.tei;
  st.token_index_map = a.saved + sl.tim;
  st.tile_prefix = a.saved + sl.tile_prefix;
  st.expert_counts = a.saved + sl.counts;
  st.status = a.saved + sl.status;
  st.H = a.mode == CheckpointMode::save_h ? a.saved + sl.H : 0;

  // 1. Routing: the picks go straight into token_expert_indices (the index build then
  //    rewrites each slot with the same value).
  const int* ids;
  const float* gates;
  if (l.router != RouterKind::none) {
    RouterGemmArgs g{reinterpret_cast<const void*>(a.x.ptr), reinterpret_cast<const void*>(a.w_router.ptr), nullptr,
                     T, dptr<void>(a.scratch, fs.logits), 0};
    ks.launch_gemm(KernelFamily::router_logits, step, g, stream, a.observer);
    float* gate_buf = a.gates_out.present() ? dptr<float>(a.gates_out) : dptr<float>(a.scratch, fs.gates);
    RouterTopkArgs r{dptr<float>(a.scratch, fs.logits), a.router_bias.present() ? dptr<float>(a.router_bias) : nullptr,
                     l.route_scale, T, dptr<int>(a.saved, sl.tei), gate_buf};
    ks.launch(KernelFamily::router_topk, ceil_div(T, kRouterWarpsPerBlock), r, stream, a.observer);
    ids = dptr<int>(a.saved, sl.tei);
    gates = gate_buf;
  } else {
    ids = dptr<int>(a.topk_ids);
    gates = dptr<float>(a.topk_weights);
  }

  // 2. Index build.
  MB_CU(drv.cuMemsetD32Async(st.status, 0, 1, stream));
  IndexBuildArgs ib{ids,
                    T,
                    fs.index_blocks,
                    dptr<int>(a.scratch, fs.block_counts),
                    dptr<int>(a.scratch, fs.block_offsets),
                    dptr<int>(a.saved, sl.eti),
                    dptr<int>(a.saved, sl.eto),
                    dptr<int>(a.saved, sl.tei),
                    dptr<int>(a.saved, sl.tim),
                    dptr<int>(a.saved, sl.tile_prefix),
                    dptr<int>(a.saved, sl.counts),
                    dptr<int>(a.saved, sl.status)};
  ks.launch(KernelFamily::index_count, fs.index_blocks, ib, stream, a.observer);
  ks.launch(KernelFamily::index_scan, 1, ib, stream, a.observer);
  ks.launch(KernelFamily::index_scatter, fs.index_blocks, ib, stream, a.observer);
  if (a.check_routing) {
    const RoutingStatus s = routing_status(st, stream);
    if (s == routing_id_out_of_range) throw InvalidArgument("topk_ids", fmt::format("an id is outside [0, {})", E));
    if (s == routing_duplicate_expert) throw InvalidArgument("topk_ids", "a token picks the same expert twice");
  }

  const RoutingView rv{dptr<int>(a.saved, sl.eti), dptr<int>(a.saved, sl.eto),      dptr<int>(a.saved, sl.tei),
                       dptr<int>(a.saved, sl.tim), dptr<int>(a.saved, sl.tile_prefix), gates, T};
  // 3. Up-projection: H saved (save-h) and h for the down-projection.
  const TileConfig& ut = ks.get(KernelFamily::gate_up).generated.spec.tile;
  GateUpArgs up{rv,
                reinterpret_cast<const void*>(a.x.ptr),
                reinterpret_cast<const void*>(a.w1.ptr),
                second_part(l, a.w1, a.w3),
                st.H ? reinterpret_cast<void*>(st.H) : nullptr,
                dptr<void>(a.scratch, fs.h)};
  up.bias = reinterpret_cast<const void*>(a.bias_up.ptr);
  attach_weight_maps(up, ut, l);
  attach_kernel_layer_maps(up, ut, l, TK, fs.chunk_slots);
  // 4. Down-projection, then the gate-weighted token-major combine.
  const TileConfig& dt = ks.get(KernelFamily::down_proj).generated.spec.tile;
  DownProjArgs down{rv, dptr<void>(a.scratch, fs.h), reinterpret_cast<const void*>(a.w2.ptr),
                    dptr<void>(a.scratch, fs.o)};
  down.bias = reinterpret_cast<const void*>(a.bias_down.ptr);
  attach_weight_maps(down, dt, l, fs.chunk_slots);
  attach_output_map(down, dt, l, TK);
  if (fs.chunk_slots >= TK) {
    ks.launch_gemm(KernelFamily::gate_up, step, up, stream, a.observer);
    ks.launch_gemm(KernelFamily::down_proj, step, down, stream, a.observer);
  } else {  // wide h: up and down projection chunk by chunk of slots, h reused (forward_chunks)
    for (int64_t lo = 0; lo < TK; lo += fs.chunk_slots) {
      const int64_t hi = std::min(TK, lo + fs.chunk_slots);
      up.slot_lo = down.slot_lo = static_cast<int>(lo);
      up.slot_hi = down.slot_hi = static_cast<int>(hi);
      const LaunchExtent chunk{.tokens = T, .slot_chunk = hi - lo};
      ks.launch_gemm(KernelFamily::gate_up, chunk, up, stream, a.observer);
      ks.launch_gemm(KernelFamily::down_proj, chunk, down, stream, a.observer);
    }
  }
  CombineArgs comb{dptr<int>(a.saved, sl.tim), gates, dptr<void>(a.scratch, fs.o), T, dptr<void>(a.y)};
  ks.launch(KernelFamily::combine, T, comb, stream, a.observer);
  st.complete = true;
  return st;
}

RoutingStatus MoeLayer::routing_status(const ForwardState& s, CUstream stream) const {
  int v = 0;
  MB_CU(cuda_driver().cuMemcpyDtoHAsync(&v, s.status, 4, stream));
  MB_CU(cuda_driver().cuStreamSynchronize(stream));
  return static_cast<RoutingStatus>(v);
}

void MoeLayer::backward(const ForwardState& s, const BackwardArgs& a, CUstream stream) const {
  validate_backward_args(config(), dgrad_bn(), s, a);
  const LayerConfig& l = config();
  const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn, G = l.gate_parts();
  const int64_t T = s.tokens, TK = T * K;
  const LaunchExtent step{.tokens = T};
  const KernelSet& ks = *kernels_;
  const TileConfig& dg = ks.get(KernelFamily::down_dgrad).generated.spec.tile;
  const BackwardScratch bs(l, T, s.mode, dg.bn);
  const GradOutput grad_output = a.dw1.dtype == DType::f32 ? GradOutput::add_f32
                                 : a.accumulate             ? GradOutput::add_bf16
                                                            : GradOutput::store_bf16;
  const int accumulate = static_cast<int>(grad_output);
  auto cptr = [](const TensorRef& t) { return reinterpret_cast<const void*>(t.ptr); };

  // Gates: the caller's, or the built-in router's recomputed (same kernels, same inputs:
  // the same picks and bitwise the same gates as in forward).
  const float* gates;
  float* d_gates;
  if (l.router != RouterKind::none) {
    RouterGemmArgs g{cptr(a.x), cptr(a.w_router), nullptr, T, dptr<void>(a.scratch, bs.logits), 0};
    ks.launch_gemm(KernelFamily::router_logits, step, g, stream, a.observer);
    RouterTopkArgs r{dptr<float>(a.scratch, bs.logits), a.router_bias.present() ? dptr<float>(a.router_bias) : nullptr,
                     l.route_scale, T, dptr<int>(a.scratch, bs.ids), dptr<float>(a.scratch, bs.gates)};
    ks.launch(KernelFamily::router_topk, ceil_div(T, kRouterWarpsPerBlock), r, stream, a.observer);
    gates = dptr<float>(a.scratch, bs.gates);
    d_gates = a.d_topk_weights.present() ? dptr<float>(a.d_topk_weights) : dptr<float>(a.scratch, bs.d_gates);
  } else {
    gates = dptr<float>(a.topk_weights);
    d_gates = dptr<float>(a.d_topk_weights);
  }
  const RoutingView rv{reinterpret_cast<const int*>(s.expert_token_indices),
                       reinterpret_cast<const int*>(s.expert_token_offsets),
                       reinterpret_cast<const int*>(s.token_expert_indices),
                       reinterpret_cast<const int*>(s.token_index_map),
                       reinterpret_cast<const int*>(s.tile_prefix),
                       gates,
                       T};

  // 1. H: saved, or recomputed by the forward up-projection kernel (H only, no h). The down
  // dgrad turns it into dH in place (BackwardScratch): a save-h backward consumes its state.
  void* H = reinterpret_cast<void*>(s.H);
  if (s.mode == CheckpointMode::recompute) {
    const TileConfig& ut = ks.get(KernelFamily::gate_up).generated.spec.tile;
    GateUpArgs up{rv, cptr(a.x), cptr(a.w1), second_part(l, a.w1, a.w3), dptr<void>(a.scratch, bs.H), nullptr};
    up.bias = cptr(a.bias_up);  // the saved H had the biases added: so has this one
    attach_weight_maps(up, ut, l);
    attach_kernel_layer_maps(up, ut, l, TK, 0);
    ks.launch_gemm(KernelFamily::gate_up, step, up, stream, a.observer);
    H = dptr<void>(a.scratch, bs.H);
  }
  // 2. Down dgrad with the activation backward and the gate-gradient partials (launched
  // below, column chunk by column chunk with the down wgrad).
  DownDgradArgs dd{rv,
                   cptr(a.dy),
                   cptr(a.w2),
                   H,
                   H,  // dH over H
                   dptr<void>(a.scratch, bs.hg),
                   dptr<float>(a.scratch, bs.partials)};
  attach_weight_maps(dd, dg, l);
  attach_kernel_layer_maps(dd, dg, l, TK);
  // 3. dW2, right after each column chunk of the down dgrad, whose hg
  // columns it reads (hg is held one chunk at a time: backward_chunk_cols).
  const TileConfig& wt2 = ks.get(KernelFamily::down_wgrad).generated.spec.tile;
  WgradArgs w2{rv, cptr(a.dy), dptr<void>(a.scratch, bs.hg), dptr<void>(a.dw2), nullptr, accumulate};
  if (bs.hg_cols >= n) {
    attach_hg_out_map(dd, dg, TK, n, n);
    ks.launch_gemm(KernelFamily::down_dgrad, step, dd, stream, a.observer);
    attach_hg_map(w2, wt2, TK, n, n);
    attach_output_maps(w2, wt2, E, d, n, n, w2.out0, nullptr);
    ks.launch_gemm(KernelFamily::down_wgrad, step, w2, stream, a.observer);
  } else {
    for (int c0 = 0; c0 < n; c0 += bs.hg_cols) {
      const int cols = std::min(bs.hg_cols, n - c0);
      const LaunchExtent chunk{.tokens = T, .col_chunk = cols};
      dd.n_tile_lo = c0 / dg.bn;
      dd.n_tiles = static_cast<int>(ceil_div(cols, dg.bn));
      dd.hg_ld = bs.hg_cols;
      attach_hg_out_map(dd, dg, TK, cols, bs.hg_cols);
      ks.launch_gemm(KernelFamily::down_dgrad, chunk, dd, stream, a.observer);
      w2.n_col0 = c0;
      w2.n_cols = cols;
      w2.b_ld = bs.hg_cols;
      attach_hg_map(w2, wt2, TK, cols, bs.hg_cols);
      // dW2's columns of this chunk (bf16, or an fp32 main gradient)
      const char* chunk_out = static_cast<const char*>(w2.out0) + int64_t{c0} * dtype_bytes(a.dw2.dtype);
      attach_output_maps(w2, wt2, E, d, cols, n, chunk_out, nullptr);
      ks.launch_gemm(KernelFamily::down_wgrad, chunk, w2, stream, a.observer);
    }
  }
  GateGradArgs gg{rv.token_index_map, dptr<float>(a.scratch, bs.partials), TK, d_gates};
  ks.launch(KernelFamily::gate_grad, ceil_div(TK, 256), gg, stream, a.observer);
  if (l.expert_bias) {  // o = h W2^T + b2: dL/dg gains <dy, b2> (before the router reads d_gates)
    GateBiasGradArgs gb{rv.token_expert_indices, cptr(a.dy), cptr(a.bias_down), TK, d_gates};
    ks.launch(KernelFamily::gate_bias_grad, ceil_div(TK, 8), gb, stream, a.observer);
  }
  // 4. Router backward, while the union region is free (hg and the gate partials are dead, dxs
  // not yet written): d logits, dx = d logits W_r (the combine below adds the experts' part),
  // and dW_r, its reduction over tokens split into parts summed in a fixed order.
  if (l.router != RouterKind::none) {
    RouterBackwardArgs rb{dptr<float>(a.scratch, bs.logits), dptr<int>(a.scratch, bs.ids), d_gates, l.route_scale, T,
                          dptr<void>(a.scratch, bs.d_logits)};
    ks.launch(KernelFamily::router_backward, ceil_div(T, kRouterWarpsPerBlock), rb, stream, a.observer);
    RouterGemmArgs rdg{nullptr, cptr(a.w_router), dptr<void>(a.scratch, bs.d_logits), T, dptr<void>(a.dx), 0};
    ks.launch_gemm(KernelFamily::router_dgrad, step, rdg, stream, a.observer);
    const TileConfig& rw = ks.get(KernelFamily::router_wgrad).generated.spec.tile;
    const int splits = router_wgrad_splits(T, E, d, rw.bm, rw.bn, rw.bk, bs.union_bytes);
    RouterGemmArgs rwg{cptr(a.x), nullptr, dptr<void>(a.scratch, bs.d_logits), T, dptr<void>(a.dw_router),
                       a.dw_router.dtype == DType::f32 ? 1 : 0, dptr<float>(a.scratch, bs.router_parts), splits, 0};
    ks.launch_gemm(KernelFamily::router_wgrad, {.tokens = T, .splits = splits}, rwg, stream, a.observer);
    if (splits > 1) {
      rwg.pass = 1;  // the parts' sum: E d / 4 float4 lanes, one wave of blocks
      ks.launch(KernelFamily::router_wgrad, kRouterWgradBlocks, rwg, stream, a.observer);
    }
  }
  // 5. dW1, dW3.
  const TileConfig& wt1 = ks.get(KernelFamily::gate_up_wgrad).generated.spec.tile;
  WgradArgs w1{rv, H, cptr(a.x), dptr<void>(a.dw1), const_cast<void*>(second_part(l, a.dw1, a.dw3)), accumulate};
  attach_dh_map(w1, wt1, TK, int64_t{G} * n);
  attach_output_maps(w1, wt1, E, n, d, d, w1.out0, G == 2 ? w1.out1 : nullptr, l.w1_rows());
  ks.launch_gemm(KernelFamily::gate_up_wgrad, step, w1, stream, a.observer);
  // 6. Token gradient: per-slot dx, then the fixed-order sum over each token's K slots (added
  // onto the router's part of dx where there is a router).
  const TileConfig& ud = ks.get(KernelFamily::gate_up_dgrad).generated.spec.tile;
  GateUpDgradArgs udg{rv, H, cptr(a.w1), second_part(l, a.w1, a.w3), dptr<void>(a.scratch, bs.dxs)};
  attach_weight_maps(udg, ud, l, TK);
  attach_output_map(udg, ud, l, TK);
  ks.launch_gemm(KernelFamily::gate_up_dgrad, step, udg, stream, a.observer);
  CombineArgs sum{rv.token_index_map, nullptr, dptr<void>(a.scratch, bs.dxs), T, dptr<void>(a.dx),
                  l.router != RouterKind::none ? 1 : 0};
  ks.launch(KernelFamily::combine, T, sum, stream, a.observer);
  if (l.expert_bias) {  // from dH (still over H: nothing after the down dgrad writes there) and dy
    BiasGradArgs bg{rv, H, cptr(a.dy), dptr<void>(a.d_bias_up), dptr<void>(a.d_bias_down), accumulate};
    const int64_t blocks = E * (ceil_div(int64_t{G} * n, 256) + ceil_div(d, 256));  // bias_grads.cuh
    ks.launch(KernelFamily::bias_grad, blocks, bg, stream, a.observer);
  }
}

}  // namespace moeblaze
