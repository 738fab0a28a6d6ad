// Bad input (no GPU): shapes that do not fit and forward/backward arguments that do not
// match get InvalidArgument naming the argument, before anything touches a device.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "core/errors.hpp"
#include "generator/layer_config.hpp"
#include "runtime/moe_layer.hpp"
#include "runtime/tma.hpp"

using namespace moeblaze;

namespace {

// Checks that `fn` throws InvalidArgument for `argument`, with a message that has `words`.
template <class F>
void expect_invalid(F&& fn, const std::string& argument, const std::string& words = "") {
  try {
    fn();
    FAIL("expected InvalidArgument for " << argument);
  } catch (const InvalidArgument& e) {
    CHECK(e.argument == argument);
    if (!words.empty()) CHECK_MESSAGE(std::string(e.what()).find(words) != std::string::npos, std::string(e.what()));
  }
}

LayerConfig layer(int E, int K, int d, int n) {
  LayerConfig l;
  l.shape = {E, K, d, n};
  return l;
}

constexpr int kDgradBn = 128;
constexpr CUdeviceptr kFakeBase = 0x7f0000000000ull;  // never dereferenced: checks read no memory

// A well-formed forward call for the caller-routing layer E=8 K=2 d=64 n=32, T tokens.
ForwardArgs good_forward(const LayerConfig& l, int64_t T) {
  const int E = l.shape.experts, K = l.shape.topk, d = l.shape.hidden, n = l.shape.ffn;
  CUdeviceptr p = kFakeBase;
  auto next = [&](size_t bytes) {
    const CUdeviceptr r = p;
    p += (bytes + 255) / 256 * 256;
    return r;
  };
  ForwardArgs a;
  a.x = {next(T * d * 2), DType::bf16, {T, d}};
  a.topk_ids = {next(T * K * 4), DType::i32, {T, K}};
  a.topk_weights = {next(T * K * 4), DType::f32, {T, K}};
  a.w1 = {next(size_t(E) * n * d * 2), DType::bf16, {E, n, d}};
  a.w3 = {next(size_t(E) * n * d * 2), DType::bf16, {E, n, d}};
  a.w2 = {next(size_t(E) * d * n * 2), DType::bf16, {E, d, n}};
  a.y = {next(T * d * 2), DType::bf16, {T, d}};
  const MemoryPlan plan = plan_memory(l, T, a.mode, kDgradBn);
  a.saved = next(plan.saved_bytes);
  a.saved_bytes = plan.saved_bytes;
  a.scratch = next(plan.forward_scratch_bytes);
  a.scratch_bytes = plan.forward_scratch_bytes;
  return a;
}

}  // namespace

TEST_CASE("validation: shapes that do not fit name the field") {
  expect_invalid([] { layer(0, 1, 64, 64).validate(); }, "experts", "E = 0");
  expect_invalid([] { layer(513, 1, 64, 64).validate(); }, "experts");
  expect_invalid([] { layer(4, 8, 64, 64).validate(); }, "topk", "larger than E");
  expect_invalid([] { layer(64, 17, 64, 64).validate(); }, "topk");
  expect_invalid([] { layer(64, 0, 64, 64).validate(); }, "topk");
  expect_invalid([] { layer(8, 2, 100, 64).validate(); }, "hidden", "multiple of 8");
  expect_invalid([] { layer(8, 2, 64, 36).validate(); }, "ffn", "multiple of 8");
  expect_invalid([] { layer(8, 2, 0, 64).validate(); }, "hidden");
  CHECK_NOTHROW(layer(1, 1, 8, 8).validate());
  CHECK_NOTHROW(layer(512, 16, 7168, 2048).validate());
  expect_invalid([] { find_preset("no-such-model"); }, "preset", "qwen3-30b-a3b");
  expect_invalid([] { parse_activation("swish"); }, "activation");
  expect_invalid([] { parse_router("top1"); }, "router");
  expect_invalid([] { parse_checkpoint_mode("save_all"); }, "mode");
}

TEST_CASE("validation: forward arguments") {
  const LayerConfig l = layer(8, 2, 64, 32);
  const int64_t T = 100;
  CHECK_NOTHROW(validate_forward_args(l, kDgradBn, good_forward(l, T)));

  SUBCASE("T = 0") {
    auto a = good_forward(l, T);
    a.x.shape = {0, 64};
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "x", "at least 1");
  }
  SUBCASE("mismatched sizes") {
    auto a = good_forward(l, T);
    a.topk_ids.shape = {T, 3};
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "topk_ids", "expected [100,2]");
    a = good_forward(l, T);
    a.w2.shape = {8, 32, 64};  // transposed
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "w2", "expected [8,64,32]");
    a = good_forward(l, T);
    a.y.shape = {T - 1, 64};
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "y");
  }
  SUBCASE("null and misaligned pointers, wrong dtype") {
    auto a = good_forward(l, T);
    a.w1.ptr = 0;
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "w1", "missing");
    a = good_forward(l, T);
    a.x.ptr += 2;
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "x", "16-byte aligned");
    a = good_forward(l, T);
    a.topk_weights.dtype = DType::bf16;
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "topk_weights", "dtype");
  }
  SUBCASE("buffers from the memory plan") {
    auto a = good_forward(l, T);
    a.saved_bytes -= 1;
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "saved", "are needed");
    a = good_forward(l, T);
    a.scratch = 0;
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "scratch", "missing");
  }
  SUBCASE("router arguments") {
    auto a = good_forward(l, T);
    a.w_router = {a.x.ptr, DType::bf16, {8, 64}};
    expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "w_router", "no built-in router");
    LayerConfig r = l;
    r.router = RouterKind::softmax_topk;
    a = good_forward(l, T);
    expect_invalid([&] { validate_forward_args(r, kDgradBn, a); }, "w_router", "missing");
  }
  SUBCASE("plain activation takes no w3") {
    LayerConfig p = l;
    p.activation = Activation::silu;
    auto a = good_forward(l, T);
    expect_invalid([&] { validate_forward_args(p, kDgradBn, a); }, "w3");
  }
}

TEST_CASE("validation: memory plan sizes follow the checkpoint mode") {
  const LayerConfig l = layer(128, 8, 2048, 768);
  const int64_t T = 32768;
  const MemoryPlan s = plan_memory(l, T, CheckpointMode::save_h, kDgradBn);
  const MemoryPlan r = plan_memory(l, T, CheckpointMode::recompute, kDgradBn);
  CHECK(s.h_floor_bytes == size_t(T) * 8 * 2 * 768 * 2);
  CHECK(s.saved_bytes >= s.h_floor_bytes);
  CHECK(s.saved_bytes <= s.h_floor_bytes * 11 / 10);   // issue target: 1.1x the H floor
  CHECK(r.saved_bytes == r.index_bytes);                 // recompute keeps the index arrays only
  CHECK(r.index_bytes < size_t(T) * 8 * 4 * 3 + 64 * 1024);
  CHECK(r.backward_scratch_bytes == s.backward_scratch_bytes + s.h_floor_bytes);  // H recomputed into scratch
  // dH is written over H: the save-h scratch is the larger of (hg + gate partials) and the
  // per-slot dx, plus the router's recomputed logits/picks/gates and their gradients.
  const size_t TK = size_t(T) * 8, n_tiles = (768 + kDgradBn - 1) / kDgradBn;
  const size_t unioned = std::max(TK * 768 * 2 + TK * n_tiles * 4, TK * 2048 * 2);
  const size_t router = l.router == RouterKind::none ? 0 : size_t(T) * 128 * 4 + 3 * TK * 4 + size_t(T) * 128 * 2;
  CHECK(s.backward_scratch_bytes >= unioned + router);
  CHECK(s.backward_scratch_bytes <= unioned + router + 8 * 256);
  CHECK_THROWS_AS(plan_memory(l, 0, CheckpointMode::save_h, kDgradBn), InvalidArgument);
  CHECK_THROWS_AS(plan_memory(l, int64_t(1) << 29, CheckpointMode::save_h, kDgradBn), InvalidArgument);
}

TEST_CASE("validation: backward arguments and forward state") {
  const LayerConfig l = layer(8, 2, 64, 32);
  const int64_t T = 100;
  const ForwardArgs fa = good_forward(l, T);
  ForwardState st;
  st.layer = l;
  st.tokens = T;
  st.saved = fa.saved;
  st.saved_bytes = fa.saved_bytes;
  st.complete = true;
  BackwardArgs b;
  b.dy = fa.y;
  b.x = fa.x;
  b.topk_weights = fa.topk_weights;
  b.w1 = fa.w1;
  b.w3 = fa.w3;
  b.w2 = fa.w2;
  b.dx = fa.y;
  b.dw1 = fa.w1;
  b.dw3 = fa.w3;
  b.dw2 = fa.w2;
  b.d_topk_weights = fa.topk_weights;
  const MemoryPlan plan = plan_memory(l, T, CheckpointMode::save_h, kDgradBn);
  b.scratch = fa.scratch;
  b.scratch_bytes = plan.backward_scratch_bytes;
  CHECK_NOTHROW(validate_backward_args(l, kDgradBn, st, b));

  SUBCASE("no forward") {
    ForwardState empty;
    expect_invalid([&] { validate_backward_args(l, kDgradBn, empty, b); }, "state", "no forward");
  }
  SUBCASE("state from another shape") {
    ForwardState other = st;
    other.layer = layer(8, 2, 64, 64);
    expect_invalid([&] { validate_backward_args(l, kDgradBn, other, b); }, "state", "another shape");
  }
  SUBCASE("gradient of the wrong size") {
    BackwardArgs bad = b;
    bad.dy.shape = {T, 32};
    expect_invalid([&] { validate_backward_args(l, kDgradBn, st, bad); }, "dy");
    bad = b;
    bad.dx.shape = {T + 1, 64};
    expect_invalid([&] { validate_backward_args(l, kDgradBn, st, bad); }, "dx");
  }
  SUBCASE("weight gradient dtypes must agree") {
    BackwardArgs bad = b;
    bad.dw2.dtype = DType::f32;
    expect_invalid([&] { validate_backward_args(l, kDgradBn, st, bad); }, "dw2", "same dtype");
  }
}

TEST_CASE("validation: TMA weight maps view [E, rows, k] as [E*rows, k] with 128-byte boxes") {
  const WeightMapParams p = weight_map_params(kFakeBase, 8 * 14336, 4096, 128, "w1");
  CHECK(p.dims[0] == 4096);
  CHECK(p.dims[1] == 8 * 14336);
  CHECK(p.strides[0] == 4096 * 2);
  CHECK(p.box[0] == 64);  // 64 bf16 = the 128-byte swizzle span
  CHECK(p.box[1] == 128);
  expect_invalid([] { weight_map_params(kFakeBase + 8, 64, 4096, 128, "w1"); }, "w1");    // 16-byte alignment
  expect_invalid([] { weight_map_params(kFakeBase, 64, 4100, 128, "w3"); }, "w3");        // row bytes % 16
  expect_invalid([] { weight_map_params(kFakeBase, 64, 4096, 512, "w2"); }, "tile");      // box rows <= 256
  expect_invalid([] { weight_map_params(kFakeBase, int64_t{1} << 31, 64, 128, "w2"); }, "w2");
}

// The device side (gemm::TmaStageLoader) expects, per block of a cluster pair, half the rows of
// a one-part stage and a whole part of a two-part one: a box of bn rows for a plain
// activation's W1 made each block land twice its bytes in a pair.
TEST_CASE("validation: K-major weight boxes of cluster pairs split one-part stages by rows, two-part ones by parts") {
  TileConfig t;
  t.bn = 96;
  CHECK(k_major_weight_box_rows(t, 1) == 96);
  CHECK(k_major_weight_box_rows(t, 2) == 96);
  t.cluster_m = 2;
  CHECK(k_major_weight_box_rows(t, 1) == 48);  // down_proj's W2, a plain activation's W1
  CHECK(k_major_weight_box_rows(t, 2) == 96);  // W1 | W3: one part from each block
  t.bn = 160;
  CHECK(k_major_weight_box_rows(t, 1) == 80);
}

TEST_CASE("validation: fp32 main gradients take the TMA epilogue on 128-row TMA-store tiles, both stagings") {
  TileConfig t = wgmma_tile(128, 256, 3, Mainloop::persistent);
  CHECK_FALSE(f32_tma_epilogue(t));  // register stores
  t.tma_store = true;
  CHECK(f32_tma_epilogue(t));  // whole-tile staging: 64-row slabs
  t.stages = 4;
  t.tma_store_blocks = true;
  CHECK(f32_tma_epilogue(t));  // 64-column staging: [64][64] chunks
  t.bm = 64;
  CHECK_FALSE(f32_tma_epilogue(t));  // a 64-row buffer holds half a chunk
}

TEST_CASE("validation: TMA-store output maps view [E, rows, cols] in 3-D with [1][bm][64] boxes") {
  const OutputMapParams p = output_map_params(kFakeBase, 8, 4096, 3584, 14336, 128, "dw2");  // a dW2 column chunk
  CHECK(p.dims[0] == 3584);
  CHECK(p.dims[1] == 4096);
  CHECK(p.dims[2] == 8);
  CHECK(p.strides[0] == 14336 * 2);
  CHECK(p.strides[1] == uint64_t{4096} * 14336 * 2);
  CHECK(p.box[0] == 64);
  CHECK(p.box[1] == 128);
  CHECK(p.box[2] == 1);
  expect_invalid([] { output_map_params(kFakeBase + 2, 8, 64, 64, 64, 128, "dw1"); }, "dw1");    // 16-byte alignment
  expect_invalid([] { output_map_params(kFakeBase, 8, 64, 64, 68, 128, "dw3"); }, "dw3");        // row bytes % 16
  expect_invalid([] { output_map_params(kFakeBase, 8, 64, 128, 64, 128, "dw2"); }, "dw2");       // ld < cols
  expect_invalid([] { output_map_params(kFakeBase, 8, 64, 64, 64, 300, "dw2"); }, "tile");       // box rows <= 256
}

TEST_CASE("validation: ragged row maps clip a box at the group's last row by their coordinates alone") {
  // deepseek-v3's o: 131072 slots of 7168 columns.
  const RaggedMapParams p = ragged_rows_map_params(kFakeBase, 131072, 7168, 7168, 128, "o");
  const uint64_t row = 7168 * 2, big = uint64_t{1} << 30;
  CHECK(p.dims[0] == 7168);
  CHECK(p.dims[1] == big);
  CHECK(p.dims[2] == (uint64_t{1} << 31) - 1);
  CHECK(p.strides[0] == row);
  CHECK(p.strides[1] == row);
  CHECK(p.box[0] == 64);
  CHECK(p.box[1] == 128);
  CHECK(p.box[2] == 1);
  // The store epilogue's box for rows [r0, r0 + n) sits at (c, 2^30 - n, r0 + n): its row i lands
  // on base + (r0 + i) rows, and rows i >= n have a coordinate at or past 2^30 (clipped).
  for (uint64_t r0 : {uint64_t{0}, uint64_t{517}, uint64_t{131071}})
    for (uint64_t n : {uint64_t{1}, uint64_t{77}, uint64_t{128}}) {
      const uint64_t y = big - n, z = r0 + n;
      for (uint64_t i : {uint64_t{0}, n - 1}) CHECK(p.base + (y + i) * row + z * row == kFakeBase + (r0 + i) * row);
      CHECK(y + n == big);  // the first clipped row
    }
  expect_invalid([] { ragged_rows_map_params(kFakeBase + 2, 64, 64, 64, 128, "o"); }, "o");   // 16-byte alignment
  expect_invalid([] { ragged_rows_map_params(kFakeBase, 64, 64, 68, 128, "o"); }, "o");       // row bytes % 16
  expect_invalid([] { ragged_rows_map_params(kFakeBase, int64_t{1} << 30, 64, 64, 128, "o"); }, "o");  // rows < 2^30
  // gate_up's 2 x 96 tiles store H's parts and h in 32-column boxes (64-byte swizzle).
  CHECK(ragged_rows_map_params(kFakeBase, 4096, 768, 1536, 128, "H", 32).box[0] == 32);
  expect_invalid([] { ragged_rows_map_params(kFakeBase, 4096, 768, 1536, 128, "H", 48); }, "tile");
}

TEST_CASE("validation: wide-h layers run the forward in slot chunks and the down backward in column chunks") {
  const LayerConfig mixtral = layer(8, 2, 4096, 14336), qwen = layer(128, 8, 2048, 768), wide_many = layer(128, 8, 1024, 4096);
  CHECK(forward_chunks(mixtral) == 4);   // n/d = 3.5
  CHECK(backward_chunk_cols(mixtral) == 3584);
  CHECK(forward_chunks(qwen) == 1);      // n < d: h is not the largest buffer
  CHECK(backward_chunk_cols(qwen) == 768);
  CHECK(forward_chunks(wide_many) == 1);  // chunk_slot_tile loops over experts: few experts only
  CHECK(forward_chunks(layer(8, 2, 4096, 6000)) == 2);
  CHECK(backward_chunk_cols(layer(8, 2, 4096, 6000)) == 3072);  // multiple of 256, 2 chunks cover n
  const int64_t T = 16384, TK = T * 2;
  const MemoryPlan p = plan_memory(mixtral, T, CheckpointMode::save_h, kDgradBn);
  // Forward: one chunk of h (TK/4 rows) and o; backward: the larger of one hg chunk (+ gate
  // partials) and the per-slot dx.
  CHECK(p.forward_scratch_bytes >= size_t(TK / 4) * 14336 * 2 + size_t(TK) * 4096 * 2);
  CHECK(p.forward_scratch_bytes < size_t(TK / 4) * 14336 * 2 + size_t(TK) * 4096 * 2 + (1 << 20));
  const size_t partials = size_t(TK) * (14336 / kDgradBn) * 4;
  const size_t unioned = std::max(size_t(TK) * 3584 * 2 + partials, size_t(TK) * 4096 * 2);  // here: dx per slot
  CHECK(p.backward_scratch_bytes >= unioned);
  CHECK(p.backward_scratch_bytes < unioned + (1 << 20));
}

TEST_CASE("validation: a fused gate_up layer takes w1 [E,2n,d] without w3, and dw1 likewise") {
  LayerConfig l = layer(8, 2, 64, 32);
  l.weight_layout = WeightLayout::fused_gate_up;
  const int64_t T = 100;
  ForwardArgs a = good_forward(l, T);
  expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "w1", "[8,64,64]");  // [E,n,d] is too short
  a.w1.shape = {8, 64, 64};
  expect_invalid([&] { validate_forward_args(l, kDgradBn, a); }, "w3", "second half");
  a.w3 = {};
  CHECK_NOTHROW(validate_forward_args(l, kDgradBn, a));
  CHECK(w1_shape(l) == std::vector<int64_t>{8, 64, 64});
  CHECK(l.describe() == "E=8 K=2 d=64 n=32 swiglu router=none gate_up=fused");

  ForwardState st;
  st.layer = l;
  st.tokens = T;
  st.saved = a.saved;
  st.saved_bytes = a.saved_bytes;
  st.complete = true;
  BackwardArgs b;
  b.dy = a.y;
  b.x = a.x;
  b.topk_weights = a.topk_weights;
  b.w1 = a.w1;
  b.w2 = a.w2;
  b.dx = a.y;
  b.dw1 = a.w1;
  b.dw2 = a.w2;
  b.d_topk_weights = a.topk_weights;
  b.scratch = a.scratch;
  b.scratch_bytes = plan_memory(l, T, CheckpointMode::save_h, kDgradBn).backward_scratch_bytes;
  CHECK_NOTHROW(validate_backward_args(l, kDgradBn, st, b));
  b.accumulate = true;  // bf16 gradients added to: same shapes
  CHECK_NOTHROW(validate_backward_args(l, kDgradBn, st, b));
  BackwardArgs bad = b;
  bad.dw3 = a.w2;
  expect_invalid([&] { validate_backward_args(l, kDgradBn, st, bad); }, "dw3", "second half");
  bad = b;
  bad.dw1.shape = {8, 32, 64};
  expect_invalid([&] { validate_backward_args(l, kDgradBn, st, bad); }, "dw1");
  // A state from the separate layout does not fit this layer.
  ForwardState other = st;
  other.layer.weight_layout = WeightLayout::separate;
  expect_invalid([&] { validate_backward_args(l, kDgradBn, other, b); }, "state", "another shape");
  // Only gated activations have a gate_up.
  l.activation = Activation::silu;
  expect_invalid([&] { l.validate(); }, "weight_layout", "gated");
}

TEST_CASE("validation: TMA views of a fused gate_up step 2n rows per expert") {
  LayerConfig l = layer(8, 2, 4096, 1024);
  CHECK(w1_map_rows(l) == 8 * 1024);
  CHECK(w3_map_rows(l) == 8 * 1024);
  l.weight_layout = WeightLayout::fused_gate_up;
  CHECK(l.w1_rows() == 2048);
  CHECK(w1_map_rows(l) == 8 * 2048);         // from W1's first row to the tensor's end
  CHECK(w3_map_rows(l) == 8 * 2048 - 1024);  // from W3's first row (n rows in) to the end
  // dW1 / dW3 stored by TMA: [E][n rows][d], experts 2n rows apart.
  const OutputMapParams p = output_map_params(kFakeBase, 8, 1024, 4096, 4096, 128, "dw1", 2048);
  CHECK(p.dims[1] == 1024);
  CHECK(p.strides[0] == 4096 * 2);
  CHECK(p.strides[1] == uint64_t{2048} * 4096 * 2);
  CHECK(output_map_params(kFakeBase, 8, 1024, 4096, 4096, 128, "dw1").strides[1] == uint64_t{1024} * 4096 * 2);
  expect_invalid([] { output_map_params(kFakeBase, 8, 1024, 4096, 4096, 128, "dw1", 512); }, "dw1", "overlap");
  // An fp32 main gradient reduce-added by TMA: 4-byte elements, [64][32] boxes (128 bytes a row).
  const OutputMapParams f = output_map_params(kFakeBase, 8, 1024, 4096, 4096, 64, "dw1", 2048, OutputElement::f32);
  CHECK(f.strides[0] == 4096 * 4);
  CHECK(f.strides[1] == uint64_t{2048} * 4096 * 4);
  CHECK(f.box[0] == 32);
  CHECK(f.box[1] == 64);
  CHECK(output_map_params(kFakeBase, 8, 1024, 4096, 4096, 128, "dw1").box[0] == 64);
  // Box rows: a kernel-layer row tile that can straddle dW1 | dW3 (n % bm != 0) goes out in 64-row
  // pieces; whole tiles otherwise, and the hand-written tiles' fp32 slabs 64 rows at a time.
  TileConfig layer_tile = wgmma_tile(128, 256, 4, Mainloop::persistent);
  layer_tile.tma_contiguous = layer_tile.tma_store = layer_tile.cute = true;
  CHECK(wgrad_output_box_rows(layer_tile, false, true, 320) == 64);
  CHECK(wgrad_output_box_rows(layer_tile, true, true, 320) == 64);
  CHECK(wgrad_output_box_rows(layer_tile, false, true, 384) == 128);
  CHECK(wgrad_output_box_rows(layer_tile, true, false, 320) == 128);  // one matrix (down_wgrad)
  TileConfig hand = wgmma_tile(128, 256, 3, Mainloop::persistent);
  hand.tma_contiguous = hand.tma_store = true;
  CHECK(wgrad_output_box_rows(hand, false, true, 320) == 128);
  CHECK(wgrad_output_box_rows(hand, true, true, 384) == 64);
  // 4 fp32 apart is 16 bytes (fine for TMA) where 4 bf16 apart is not.
  CHECK(output_map_params(kFakeBase, 8, 64, 4, 4, 64, "dw2", 0, OutputElement::f32).strides[0] == 16);
  expect_invalid([] { output_map_params(kFakeBase, 8, 64, 4, 4, 64, "dw2"); }, "dw2");
}
