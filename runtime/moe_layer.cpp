#include "moe_layer.hpp"

#include <fmt/format.h>

#include <atomic>

#include "moeblaze/kernel_args.cuh"
#include "tma.hpp"

namespace moeblaze {
namespace {

constexpr size_t kAlign = 256;
constexpr int kIndexSlotsPerBlock = 2048;  // index_build.cuh SLOTS_PER_BLOCK
constexpr int kRouterWarpsPerBlock = 8;    // router.cuh WARPS_PER_BLOCK

size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int padded_experts(int e) { return (e + 7) / 8 * 8; }

// Appends aligned regions to a buffer layout.
struct Layout {
  size_t total = 0;
  size_t add(size_t bytes) {
    const size_t at = total;
    total += align_up(bytes);
    return at;
  }
};

// Byte offsets of everything forward keeps for backward.
struct SavedLayout {
  size_t eti, eto, tei, tim, tile_prefix, counts, status, H = 0, total, index_bytes;
  SavedLayout(const LayerConfig& l, int64_t T, CheckpointMode mode) {
    const int64_t TK = T * l.shape.topk;
    const int E = l.shape.experts;
    Layout b;
    eti = b.add(TK * 4);
    eto = b.add((E + 1) * 4);
    tei = b.add(TK * 4);
    tim = b.add(TK * 4);
    tile_prefix = b.add(kTilePrefixRows * (E + 1) * 4);
    counts = b.add(E * 4);
    status = b.add(4);
    index_bytes = b.total;
    if (mode == CheckpointMode::save_h) H = b.add(static_cast<size_t>(TK) * l.gate_parts() * l.shape.ffn * 2);
    total = b.total;
  }
};

struct ForwardScratch {
  size_t logits = 0, gates = 0, block_counts, block_offsets, h, o, total;
  int index_blocks;
  int64_t chunk_slots;  // slots per forward chunk (h holds one chunk)
  ForwardScratch(const LayerConfig& l, int64_t T) {
    const int64_t TK = T * l.shape.topk;
    chunk_slots = ceil_div(TK, forward_chunks(l));
    const int E = l.shape.experts;
    index_blocks = static_cast<int>(ceil_div(TK, kIndexSlotsPerBlock));
    Layout b;
    if (l.router != RouterKind::none) {
      logits = b.add(static_cast<size_t>(T) * E * 4);
      gates = b.add(TK * 4);
    }
    block_counts = b.add(static_cast<size_t>(E) * index_blocks * 4);
    block_offsets = b.add(static_cast<size_t>(E) * index_blocks * 4);
    h = b.add(static_cast<size_t>(chunk_slots) * l.shape.ffn * 2);
    o = b.add(static_cast<size_t>(TK) * l.shape.hidden * 2);
    total = b.total;
  }
};

// Backward scratch. dH = [dA|dB] is written over H (save-h: the saved H, which the backward
// consumes; recompute: the recomputed H): the down-dgrad epilogue reads each H element and
// writes the dH element at the same place from the same thread, and nothing reads H after it
// (the down wgrad takes hg). That saves T*K*G*n*2 bytes of peak (1.8 GiB on mixtral-8x7b).
struct BackwardScratch {
  int hg_cols;  // columns of hg: one backward column chunk (backward_chunk_cols)
  size_t H = 0, hg, partials, dxs, logits = 0, ids = 0, gates = 0, d_gates = 0, d_logits = 0, total;
  BackwardScratch(const LayerConfig& l, int64_t T, CheckpointMode mode, int dgrad_bn) {
    const int64_t TK = T * l.shape.topk;
    const int E = l.shape.experts, G = l.gate_parts(), n = l.shape.ffn, d = l.shape.hidden;
    const int64_t n_tiles = ceil_div(n, dgrad_bn);
    Layout b;
    if (mode == CheckpointMode::recompute) H = b.add(static_cast<size_t>(TK) * G * n * 2);
    // hg and the gate partials die (down wgrad, gate grad) before dxs is written (up dgrad).
    Layout u;
    hg_cols = backward_chunk_cols(l);
    hg = u.add(static_cast<size_t>(TK) * hg_cols * 2);
    partials = u.add(static_cast<size_t>(TK) * n_tiles * 4);
    const size_t union_bytes = std::max(u.total, align_up(static_cast<size_t>(TK) * d * 2));
    const size_t union_at = b.add(union_bytes);
    hg += union_at;
    partials += union_at;
    dxs = union_at;
    if (l.router != RouterKind::none) {
      logits = b.add(static_cast<size_t>(T) * E * 4);
      ids = b.add(TK * 4);
      gates = b.add(TK * 4);
      d_gates = b.add(TK * 4);
      d_logits = b.add(static_cast<size_t>(T) * padded_experts(E) * 2);
    }
    total = b.total;
  }
};

std::atomic<uint64_t> next_layer_id{1};

// ---- argument checks ----------------------------------------------------------------------
std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

void expect_tensor(const TensorRef& t, const char* name, DType dtype, std::vector<int64_t> shape,
                   bool allow_f32 = false) {
  if (!t.ptr) throw InvalidArgument(name, "is missing (null pointer)");
  const bool dtype_ok = t.dtype == dtype || (allow_f32 && t.dtype == DType::f32);
  if (!dtype_ok)
    throw InvalidArgument(name, fmt::format("has dtype {}, expected {}{}", to_string(t.dtype), to_string(dtype),
                                            allow_f32 ? " or f32" : ""));
  if (t.shape != shape)
    throw InvalidArgument(name, fmt::format("has shape {}, expected {}", shape_string(t.shape), shape_string(shape)));
  // Rows are read 16 bytes at a time.
  if (t.ptr % 16 != 0) throw InvalidArgument(name, fmt::format("pointer {:#x} is not 16-byte aligned", t.ptr));
}

void expect_absent(const TensorRef& t, const char* name, const char* why) {
  if (t.ptr) throw InvalidArgument(name, why);
}

void expect_buffer(CUdeviceptr p, size_t have, size_t need, const char* name) {
  if (need == 0) return;
  if (!p) throw InvalidArgument(name, fmt::format("is missing; {} bytes are needed (see memory_plan)", need));
  if (p % kAlign != 0) throw InvalidArgument(name, fmt::format("pointer {:#x} is not {}-byte aligned", p, kAlign));
  if (have < need) throw InvalidArgument(name, fmt::format("has {} bytes, {} are needed (see memory_plan)", have, need));
}

int64_t tokens_of(const TensorRef& x, const char* name) {
  if (x.shape.size() != 2) throw InvalidArgument(name, fmt::format("must be 2-D [T,d], got {}", shape_string(x.shape)));
  if (x.shape[0] <= 0) throw InvalidArgument(name, fmt::format("has T = {} tokens; T must be at least 1", x.shape[0]));
  return x.shape[0];
}

// TMA tiles (TileConfig::tma) read their weight tiles through tensor maps in the argument.
void attach_weight_maps(UpProjArgs& up, const TileConfig& t, const LayerConfig& l) {
  if (!t.tma) return;
  const int64_t rows = int64_t{l.shape.experts} * l.shape.ffn;
  up.tma_w1 = encode_weight_map(reinterpret_cast<CUdeviceptr>(up.w1), rows, l.shape.hidden, t.bn, "w1");
  if (up.w3) up.tma_w3 = encode_weight_map(reinterpret_cast<CUdeviceptr>(up.w3), rows, l.shape.hidden, t.bn, "w3");
}
void attach_weight_maps(DownProjArgs& down, const TileConfig& t, const LayerConfig& l) {
  if (!t.tma) return;
  const int64_t rows = int64_t{l.shape.experts} * l.shape.hidden;
  down.tma_w2 = encode_weight_map(reinterpret_cast<CUdeviceptr>(down.w2), rows, l.shape.ffn, t.bn, "w2");
}

// Grid of a chunked launch (gemm::chunk_slot_tile): each expert meets the chunk in at most
// ceil(its slots there / bm) + 1 of its bm-aligned tiles.
int64_t chunk_tile_blocks(int64_t slots, int bm, int bn, int experts, int n_out) {
  return (ceil_div(slots, int64_t{bm}) + 2 * int64_t{experts}) * ceil_div(int64_t{n_out}, int64_t{bn});
}

// up_wgrad reads dH (A: [T*K, G*n]), down_wgrad hg (B: [T*K, cols], rows ld apart) by TMA.
void attach_dh_map(WgradArgs& w, const TileConfig& t, int64_t slots, int64_t cols) {
  if (t.tma) w.tma_a = encode_weight_map(reinterpret_cast<CUdeviceptr>(w.a), slots, cols, 64, "dH");
}
void attach_hg_map(WgradArgs& w, const TileConfig& t, int64_t slots, int64_t cols, int64_t ld) {
  if (t.tma) w.tma_b = encode_weight_map(reinterpret_cast<CUdeviceptr>(w.b), slots, cols, 64, "hg", ld);
}

template <class T>
T* dptr(CUdeviceptr base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}
template <class T>
T* dptr(const TensorRef& t) {
  return reinterpret_cast<T*>(t.ptr);
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

MoeLayer MoeLayer::build(const LayerConfig& layer, const std::string& arch) {
  auto set = std::make_shared<KernelSet>(KernelSet::compile(layer, arch));
  set->load();
  return MoeLayer(std::move(set));
}

int MoeLayer::dgrad_bn() const { return kernels_->get(KernelFamily::down_dgrad).generated.spec.tile.bn; }

MemoryPlan MoeLayer::memory_plan(int64_t tokens, CheckpointMode mode) const {
  return plan_memory(config(), tokens, mode, dgrad_bn());
}

int backward_chunk_cols(const LayerConfig& l) {
  // hg = g*h is [T*K, n] (the down wgrad's input): with n > d the backward's largest buffer,
  // so down dgrad + down wgrad run in column chunks of a multiple of 256 (every dgrad/wgrad
  // tile width divides it), as many as the forward has slot chunks.
  const int chunks = forward_chunks(l);
  if (chunks == 1) return l.shape.ffn;
  return static_cast<int>(ceil_div(ceil_div(l.shape.ffn, chunks), 256) * 256);
}

int forward_chunks(const LayerConfig& l) {
  // h = act(A)*B is [T*K, n]; with n > d it is the forward's largest buffer (mixtral-8x7b:
  // 896 MiB beside o's 256), so the forward runs in up to 4 slot chunks that reuse one h.
  // chunk_slot_tile loops over the experts per block: only for layers with few of them.
  if (l.shape.ffn <= l.shape.hidden || l.shape.experts > 64) return 1;
  return static_cast<int>(std::min<int64_t>(4, ceil_div(int64_t{l.shape.ffn}, int64_t{l.shape.hidden})));
}

MemoryPlan plan_memory(const LayerConfig& l, int64_t tokens, CheckpointMode mode, int dgrad_bn) {
  if (tokens <= 0) throw InvalidArgument("tokens", fmt::format("T = {} must be at least 1", tokens));
  if (tokens * l.shape.topk >= (int64_t{1} << 31))
    throw InvalidArgument("tokens", fmt::format("T*K = {} must stay below 2^31", tokens * l.shape.topk));
  MemoryPlan p;
  const SavedLayout s(l, tokens, mode);
  p.saved_bytes = s.total;
  p.index_bytes = s.index_bytes;
  p.forward_scratch_bytes = ForwardScratch(l, tokens).total;
  p.backward_scratch_bytes = BackwardScratch(l, tokens, mode, dgrad_bn).total;
  p.h_floor_bytes = static_cast<size_t>(tokens) * l.shape.topk * l.gate_parts() * l.shape.ffn * 2;
  return p;
}

void validate_forward_args(const LayerConfig& l, int dgrad_bn, const ForwardArgs& a) {
  const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn;
  const int64_t T = tokens_of(a.x, "x");
  expect_tensor(a.x, "x", DType::bf16, {T, d});
  if (l.router == RouterKind::none) {
    expect_tensor(a.topk_ids, "topk_ids", DType::i32, {T, K});
    expect_tensor(a.topk_weights, "topk_weights", DType::f32, {T, K});
    expect_absent(a.w_router, "w_router", "given, but this layer has no built-in router (router=none)");
  } else {
    expect_tensor(a.w_router, "w_router", DType::bf16, {E, d});
    expect_absent(a.topk_ids, "topk_ids", "given, but the built-in router computes the picks");
    expect_absent(a.topk_weights, "topk_weights", "given, but the built-in router computes the gates");
    if (a.gates_out.present()) expect_tensor(a.gates_out, "gates_out", DType::f32, {T, K});
    if (a.router_bias.present()) {
      if (l.router != RouterKind::sigmoid_topk)
        throw InvalidArgument("router_bias", "only the sigmoid router takes a bias");
      expect_tensor(a.router_bias, "router_bias", DType::f32, {E});
    }
  }
  expect_tensor(a.w1, "w1", DType::bf16, {E, n, d});
  if (is_gated(l.activation)) expect_tensor(a.w3, "w3", DType::bf16, {E, n, d});
  else expect_absent(a.w3, "w3", "given, but a plain activation uses W1 alone");
  expect_tensor(a.w2, "w2", DType::bf16, {E, d, n});
  expect_tensor(a.y, "y", DType::bf16, {T, d});
  const MemoryPlan p = plan_memory(l, T, a.mode, dgrad_bn);
  expect_buffer(a.saved, a.saved_bytes, p.saved_bytes, "saved");
  expect_buffer(a.scratch, a.scratch_bytes, p.forward_scratch_bytes, "scratch");
}

ForwardState MoeLayer::forward(const ForwardArgs& a, CUstream stream) const {
  validate_forward_args(config(), dgrad_bn(), a);
  const LayerConfig& l = config();
  const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn;
  const int64_t T = a.x.shape[0], TK = T * K;
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
    const TileConfig& lt = ks.get(KernelFamily::router_logits).generated.spec.tile;
    RouterGemmArgs g{reinterpret_cast<const void*>(a.x.ptr), reinterpret_cast<const void*>(a.w_router.ptr), nullptr,
                     T, dptr<void>(a.scratch, fs.logits), 0};
    ks.launch(KernelFamily::router_logits, ceil_div(T, lt.bm) * ceil_div(E, lt.bn), g, stream, a.observer);
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
  const TileConfig& ut = ks.get(KernelFamily::up_proj).generated.spec.tile;
  UpProjArgs up{rv,
                reinterpret_cast<const void*>(a.x.ptr),
                reinterpret_cast<const void*>(a.w1.ptr),
                reinterpret_cast<const void*>(a.w3.ptr),
                st.H ? reinterpret_cast<void*>(st.H) : nullptr,
                dptr<void>(a.scratch, fs.h)};
  attach_weight_maps(up, ut, l);
  // 4. Down-projection, then the gate-weighted token-major combine.
  const TileConfig& dt = ks.get(KernelFamily::down_proj).generated.spec.tile;
  DownProjArgs down{rv, dptr<void>(a.scratch, fs.h), reinterpret_cast<const void*>(a.w2.ptr),
                    dptr<void>(a.scratch, fs.o)};
  attach_weight_maps(down, dt, l);
  if (fs.chunk_slots >= TK) {
    ks.launch(KernelFamily::up_proj, slot_tile_blocks(TK, ut.bm, ut.bn, E, n), up, stream, a.observer);
    ks.launch(KernelFamily::down_proj, slot_tile_blocks(TK, dt.bm, dt.bn, E, d), down, stream, a.observer);
  } else {  // wide h: up and down projection chunk by chunk of slots, h reused (forward_chunks)
    for (int64_t lo = 0; lo < TK; lo += fs.chunk_slots) {
      const int64_t hi = std::min(TK, lo + fs.chunk_slots);
      up.slot_lo = down.slot_lo = static_cast<int>(lo);
      up.slot_hi = down.slot_hi = static_cast<int>(hi);
      ks.launch(KernelFamily::up_proj, chunk_tile_blocks(hi - lo, ut.bm, ut.bn, E, n), up, stream, a.observer);
      ks.launch(KernelFamily::down_proj, chunk_tile_blocks(hi - lo, dt.bm, dt.bn, E, d), down, stream, a.observer);
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

void validate_backward_args(const LayerConfig& l, int dgrad_bn, const ForwardState& s, const BackwardArgs& a) {
  if (!s.complete || !s.saved) throw InvalidArgument("state", "no forward has filled this state");
  {
    const auto& o = s.layer.shape;
    const auto& m = l.shape;
    if (o.experts != m.experts || o.topk != m.topk || o.hidden != m.hidden || o.ffn != m.ffn ||
        s.layer.activation != l.activation || s.layer.router != l.router)
      throw InvalidArgument("state", fmt::format("comes from a layer of another shape ({}), this layer is {}",
                                                 s.layer.describe(), l.describe()));
  }
  const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn;
  const int64_t T = s.tokens;
  expect_tensor(a.dy, "dy", DType::bf16, {T, d});
  expect_tensor(a.x, "x", DType::bf16, {T, d});
  expect_tensor(a.w1, "w1", DType::bf16, {E, n, d});
  if (is_gated(l.activation)) expect_tensor(a.w3, "w3", DType::bf16, {E, n, d});
  expect_tensor(a.w2, "w2", DType::bf16, {E, d, n});
  expect_tensor(a.dx, "dx", DType::bf16, {T, d});
  expect_tensor(a.dw1, "dw1", DType::bf16, {E, n, d}, true);
  if (is_gated(l.activation)) {
    expect_tensor(a.dw3, "dw3", DType::bf16, {E, n, d}, true);
    if (a.dw3.dtype != a.dw1.dtype) throw InvalidArgument("dw3", "must have the same dtype as dw1");
  }
  expect_tensor(a.dw2, "dw2", DType::bf16, {E, d, n}, true);
  if (a.dw2.dtype != a.dw1.dtype) throw InvalidArgument("dw2", "must have the same dtype as dw1");
  if (l.router == RouterKind::none) {
    expect_tensor(a.topk_weights, "topk_weights", DType::f32, {T, K});
    expect_tensor(a.d_topk_weights, "d_topk_weights", DType::f32, {T, K});
  } else {
    expect_tensor(a.w_router, "w_router", DType::bf16, {E, d});
    expect_tensor(a.dw_router, "dw_router", DType::bf16, {E, d}, true);
    if (a.d_topk_weights.present()) expect_tensor(a.d_topk_weights, "d_topk_weights", DType::f32, {T, K});
    if (a.router_bias.present()) expect_tensor(a.router_bias, "router_bias", DType::f32, {E});
  }
  const MemoryPlan p = plan_memory(l, T, s.mode, dgrad_bn);
  if (s.saved_bytes < p.saved_bytes) throw InvalidArgument("state", "saved buffer is smaller than this shape needs");
  expect_buffer(a.scratch, a.scratch_bytes, p.backward_scratch_bytes, "scratch");
}

void MoeLayer::backward(const ForwardState& s, const BackwardArgs& a, CUstream stream) const {
  validate_backward_args(config(), dgrad_bn(), s, a);
  const LayerConfig& l = config();
  const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn, G = l.gate_parts();
  const int64_t T = s.tokens, TK = T * K;
  const KernelSet& ks = *kernels_;
  const TileConfig& dg = ks.get(KernelFamily::down_dgrad).generated.spec.tile;
  const BackwardScratch bs(l, T, s.mode, dg.bn);
  const int accumulate = a.dw1.dtype == DType::f32 ? 1 : 0;
  auto cptr = [](const TensorRef& t) { return reinterpret_cast<const void*>(t.ptr); };

  // Gates: the caller's, or the built-in router's recomputed (same kernels, same inputs:
  // the same picks and bitwise the same gates as in forward).
  const float* gates;
  float* d_gates;
  if (l.router != RouterKind::none) {
    const TileConfig& lt = ks.get(KernelFamily::router_logits).generated.spec.tile;
    RouterGemmArgs g{cptr(a.x), cptr(a.w_router), nullptr, T, dptr<void>(a.scratch, bs.logits), 0};
    ks.launch(KernelFamily::router_logits, ceil_div(T, lt.bm) * ceil_div(E, lt.bn), g, stream, a.observer);
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
    const TileConfig& ut = ks.get(KernelFamily::up_proj).generated.spec.tile;
    UpProjArgs up{rv, cptr(a.x), cptr(a.w1), cptr(a.w3), dptr<void>(a.scratch, bs.H), nullptr};
    attach_weight_maps(up, ut, l);
    ks.launch(KernelFamily::up_proj, slot_tile_blocks(TK, ut.bm, ut.bn, E, n), up, stream, a.observer);
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
  // 3. Weight gradients. dW2 right after each column chunk of the down dgrad, whose hg
  // columns it reads (hg is held one chunk at a time: backward_chunk_cols).
  const TileConfig& wt2 = ks.get(KernelFamily::down_wgrad).generated.spec.tile;
  WgradArgs w2{rv, cptr(a.dy), dptr<void>(a.scratch, bs.hg), dptr<void>(a.dw2), nullptr, accumulate};
  if (bs.hg_cols >= n) {
    ks.launch(KernelFamily::down_dgrad, slot_tile_blocks(TK, dg.bm, dg.bn, E, n), dd, stream, a.observer);
    attach_hg_map(w2, wt2, TK, n, n);
    ks.launch(KernelFamily::down_wgrad, E * ceil_div(d, wt2.bm) * ceil_div(n, wt2.bn), w2, stream, a.observer);
  } else {
    for (int c0 = 0; c0 < n; c0 += bs.hg_cols) {
      const int cols = std::min(bs.hg_cols, n - c0);
      dd.n_tile_lo = c0 / dg.bn;
      dd.n_tiles = static_cast<int>(ceil_div(cols, dg.bn));
      dd.hg_ld = bs.hg_cols;
      ks.launch(KernelFamily::down_dgrad, slot_tile_blocks(TK, dg.bm, dg.bn, E, cols), dd, stream, a.observer);
      w2.n_col0 = c0;
      w2.n_cols = cols;
      w2.b_ld = bs.hg_cols;
      attach_hg_map(w2, wt2, TK, cols, bs.hg_cols);
      ks.launch(KernelFamily::down_wgrad, E * ceil_div(d, wt2.bm) * ceil_div(cols, wt2.bn), w2, stream, a.observer);
    }
  }
  GateGradArgs gg{rv.token_index_map, dptr<float>(a.scratch, bs.partials), TK, d_gates};
  ks.launch(KernelFamily::gate_grad, ceil_div(TK, 256), gg, stream, a.observer);
  const TileConfig& wt1 = ks.get(KernelFamily::up_wgrad).generated.spec.tile;
  WgradArgs w1{rv, H, cptr(a.x), dptr<void>(a.dw1), dptr<void>(a.dw3), accumulate};
  attach_dh_map(w1, wt1, TK, int64_t{G} * n);
  ks.launch(KernelFamily::up_wgrad, E * ceil_div(G * n, wt1.bm) * ceil_div(d, wt1.bn), w1, stream, a.observer);
  // 4. Token gradient: per-slot dx, then the fixed-order sum over each token's K slots.
  const TileConfig& ud = ks.get(KernelFamily::up_dgrad).generated.spec.tile;
  UpDgradArgs udg{rv, H, cptr(a.w1), cptr(a.w3), dptr<void>(a.scratch, bs.dxs)};
  ks.launch(KernelFamily::up_dgrad, slot_tile_blocks(TK, ud.bm, ud.bn, E, d), udg, stream, a.observer);
  CombineArgs sum{rv.token_index_map, nullptr, dptr<void>(a.scratch, bs.dxs), T, dptr<void>(a.dx)};
  ks.launch(KernelFamily::combine, T, sum, stream, a.observer);
  // 5. Router backward: d logits, then dx += d logits W_r and dW_r.
  if (l.router != RouterKind::none) {
    RouterBackwardArgs rb{dptr<float>(a.scratch, bs.logits), dptr<int>(a.scratch, bs.ids), d_gates, l.route_scale, T,
                          dptr<void>(a.scratch, bs.d_logits)};
    ks.launch(KernelFamily::router_backward, ceil_div(T, kRouterWarpsPerBlock), rb, stream, a.observer);
    const TileConfig& rd = ks.get(KernelFamily::router_dgrad).generated.spec.tile;
    RouterGemmArgs rdg{nullptr, cptr(a.w_router), dptr<void>(a.scratch, bs.d_logits), T, dptr<void>(a.dx), 0};
    ks.launch(KernelFamily::router_dgrad, ceil_div(T, rd.bm) * ceil_div(d, rd.bn), rdg, stream, a.observer);
    const TileConfig& rw = ks.get(KernelFamily::router_wgrad).generated.spec.tile;
    RouterGemmArgs rwg{cptr(a.x), nullptr, dptr<void>(a.scratch, bs.d_logits), T, dptr<void>(a.dw_router),
                       a.dw_router.dtype == DType::f32 ? 1 : 0};
    ks.launch(KernelFamily::router_wgrad, ceil_div(padded_experts(E), rw.bm) * ceil_div(d, rw.bn), rwg, stream, a.observer);
  }
}

}  // namespace moeblaze
