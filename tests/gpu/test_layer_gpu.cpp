// GPU tests: the whole layer against the CPU reference over a table of cases (shapes,
// activations, routers, routing distributions, checkpoint modes). Exit code 77 (CTest:
// skipped) with a message when no GPU is present (gpu_main.cpp). Label: gpu.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "check_result.hpp"
#include "core/bf16.hpp"
#include "runtime/cuda_driver.hpp"
#include "testing/layer_check.hpp"

using namespace moeblaze;

namespace {

struct Case {
  const char* name;
  MoeShape shape;
  int64_t tokens;
  Activation act = Activation::swiglu;
  RouterKind router = RouterKind::none;
  bool renorm = false;
  float scale = 1.f;
  RoutingDistribution routing = RoutingDistribution::random;
  CheckpointMode mode = CheckpointMode::save_h;
  bool accumulate = false;
  WeightLayout layout = WeightLayout::separate;
  bool expert_bias = false;
};

const Case kCases[] = {
    {"small swiglu", {8, 2, 256, 128}, 512},
    {"small swiglu recompute", {8, 2, 256, 128}, 512, Activation::swiglu, RouterKind::none, false, 1.f,
     RoutingDistribution::random, CheckpointMode::recompute},
    {"geglu", {16, 4, 192, 320}, 700, Activation::geglu},
    {"silu (single up matrix)", {16, 2, 128, 192}, 300, Activation::silu},
    {"gelu (single up matrix) recompute", {16, 2, 128, 192}, 300, Activation::gelu, RouterKind::none, false, 1.f,
     RoutingDistribution::random, CheckpointMode::recompute},
    {"relu", {4, 1, 64, 64}, 200, Activation::relu},
    {"T=1", {8, 2, 128, 64}, 1},
    {"skewed routing", {32, 4, 256, 256}, 2048, Activation::swiglu, RouterKind::none, false, 1.f,
     RoutingDistribution::skewed},
    {"all tokens on the same experts", {16, 2, 128, 128}, 1000, Activation::swiglu, RouterKind::none, false, 1.f,
     RoutingDistribution::one_hot},
    {"balanced, experts without tokens", {64, 1, 128, 128}, 40, Activation::swiglu, RouterKind::none, false, 1.f,
     RoutingDistribution::balanced},
    {"d and n not multiples of 64", {8, 2, 200, 136}, 333},
    {"softmax router", {64, 8, 256, 128}, 1024, Activation::swiglu, RouterKind::softmax_topk, false},
    {"softmax router renorm, E not a multiple of 8", {60, 4, 128, 128}, 777, Activation::swiglu,
     RouterKind::softmax_topk, true},
    {"sigmoid router with bias, renorm, scale", {256, 8, 256, 128}, 1024, Activation::swiglu,
     RouterKind::sigmoid_topk, true, 2.5f},
    {"E=512 K=16 recompute", {512, 16, 128, 64}, 2048, Activation::swiglu, RouterKind::softmax_topk, true, 1.f,
     RoutingDistribution::random, CheckpointMode::recompute},
    {"fp32 gradient accumulation", {8, 2, 128, 128}, 256, Activation::swiglu, RouterKind::softmax_topk, true, 1.f,
     RoutingDistribution::random, CheckpointMode::save_h, true},
    // The Hugging Face gate_up [E,2n,d]: n a multiple of 128 (tiles inside W1 or W3), not of
    // 64 (column tiles read W3 rows past W1's end, the last expert's past the tensor), wide
    // and chunked (n > d), recompute, fp32 accumulation into the fused layout.
    {"fused gate_up", {16, 4, 256, 128}, 700, Activation::swiglu, RouterKind::none, false, 1.f,
     RoutingDistribution::random, CheckpointMode::save_h, false, WeightLayout::fused_gate_up},
    {"fused gate_up, n not a multiple of 64, geglu", {8, 2, 200, 136}, 333, Activation::geglu, RouterKind::none, false,
     1.f, RoutingDistribution::random, CheckpointMode::save_h, false, WeightLayout::fused_gate_up},
    {"fused gate_up, n > d (chunked), recompute", {8, 2, 256, 768}, 600, Activation::swiglu, RouterKind::softmax_topk,
     true, 1.f, RoutingDistribution::random, CheckpointMode::recompute, false, WeightLayout::fused_gate_up},
    {"fused gate_up, fp32 accumulation, sigmoid router", {64, 8, 256, 128}, 1024, Activation::swiglu,
     RouterKind::sigmoid_topk, true, 2.5f, RoutingDistribution::random, CheckpointMode::save_h, true,
     WeightLayout::fused_gate_up},
    // GPT-OSS's experts: clamped SwiGLU, expert biases, fused gate_up; d = 2880-like widths
    // (multiples of 192, not 256) at a small scale, recompute, fp32 accumulation.
    {"gpt-oss: clamped swiglu, biases", {32, 4, 576, 192}, 1000, Activation::clamped_swiglu, RouterKind::none, false,
     1.f, RoutingDistribution::random, CheckpointMode::save_h, false, WeightLayout::fused_gate_up, true},
    {"gpt-oss: clamped swiglu, biases, recompute, softmax router", {32, 4, 256, 128}, 700,
     Activation::clamped_swiglu, RouterKind::softmax_topk, true, 1.f, RoutingDistribution::random,
     CheckpointMode::recompute, false, WeightLayout::fused_gate_up, true},
    {"gpt-oss: clamped swiglu, biases, fp32 accumulation, separate W1/W3", {8, 2, 128, 64}, 300,
     Activation::clamped_swiglu, RouterKind::none, false, 1.f, RoutingDistribution::random, CheckpointMode::save_h,
     true, WeightLayout::separate, true},
};

}  // namespace

TEST_CASE("gpu: layer forward and backward match the CPU reference") {
  DeviceContext ctx(0);
  for (const Case& c : kCases) {
    SUBCASE(c.name) {
      LayerCheckOptions o;
      o.layer.shape = c.shape;
      o.layer.activation = c.act;
      o.layer.router = c.router;
      o.layer.renormalize = c.renorm;
      o.layer.route_scale = c.scale;
      o.layer.weight_layout = c.layout;
      o.layer.expert_bias = c.expert_bias;
      o.tokens = c.tokens;
      o.routing = c.routing;
      o.mode = c.mode;
      o.accumulate_fp32 = c.accumulate;
      o.sample_tokens = 512;
      o.sample_experts = 4;
      tests::check_layer_result(c.name, run_layer_check(o), o.tolerance);
    }
  }
}

// Caller-routing ids outside [0, E) with the routing check off: each such pick is left out,
// so the layer must compute exactly what the CPU reference computes without it (its gate 0),
// write every output element (they start as NaN, and the bad picks' gates are NaN too: a
// left-out slot's gate must never be read), and give the left-out slots a gate gradient of
// exactly 0. One pick each is E, E + 5 and -1, and one token has every pick 2^31 - 1 (its y
// and dx rows are 0). The cases cover the kernels that read a slot token-major: the combine
// (forward and dx), gate_grad, down_dgrad's gates, the bias gradients, and the chunked forward.
TEST_CASE("gpu: caller-routing ids outside [0, E) are left out: outputs and gradients of the reference without them") {
  DeviceContext ctx(0);
  struct BadCase {
    const char* name;
    MoeShape shape;
    int64_t tokens;
    CheckpointMode mode = CheckpointMode::save_h;
    WeightLayout layout = WeightLayout::separate;
    Activation act = Activation::swiglu;
    bool expert_bias = false;
  };
  const BadCase cases[] = {
      {"swiglu", {16, 4, 256, 128}, 700},
      {"recompute, top-1", {8, 1, 128, 128}, 300, CheckpointMode::recompute},
      {"n > d (chunked forward)", {8, 2, 256, 768}, 600, CheckpointMode::save_h, WeightLayout::fused_gate_up},
      {"gpt-oss: biases", {32, 4, 256, 128}, 500, CheckpointMode::save_h, WeightLayout::fused_gate_up,
       Activation::clamped_swiglu, true},
  };
  for (const BadCase& b : cases) {
    SUBCASE(b.name) {
      LayerCheckOptions o;
      o.layer.shape = b.shape;
      o.layer.activation = b.act;
      o.layer.weight_layout = b.layout;
      o.layer.expert_bias = b.expert_bias;
      o.tokens = b.tokens;
      o.mode = b.mode;
      o.sample_tokens = 512;
      o.sample_experts = 4;
      const int E = b.shape.experts, K = b.shape.topk;
      const int64_t T = b.tokens;
      o.bad_ids = {{1 * K + (K - 1), E}, {(T / 2) * K, E + 5}, {(T / 3) * K + (K - 1) / 2, -1}};
      for (int j = 0; j < K; ++j) o.bad_ids.push_back({(T - 1) * K + j, 2147483647});
      const LayerCheckResult r = run_layer_check(o);
      tests::check_layer_result(b.name, r, o.tolerance);
      bool has_own_lines = false;  // the check compared the bad tokens on lines of their own
      for (const auto& e : r.errors) has_own_lines |= e.name.find("left-out") != std::string::npos;
      CHECK(has_own_lines);
    }
  }
}

TEST_CASE("gpu: routing ids on the device that are out of range or repeated are reported, nothing is written out of bounds") {
  DeviceContext ctx(0);
  LayerConfig l;
  l.shape = {8, 2, 64, 64};
  const MoeLayer layer = MoeLayer::build(l, ctx.info().arch());
  const int64_t T = 64;
  const MemoryPlan plan = layer.memory_plan(T, CheckpointMode::save_h);
  DeviceBuffer x(T * 64 * 2), w1(8 * 64 * 64 * 2), w3(8 * 64 * 64 * 2), w2(8 * 64 * 64 * 2), y(T * 64 * 2),
      ids(T * 2 * 4), gates(T * 2 * 4), saved(plan.saved_bytes), scratch(plan.forward_scratch_bytes);
  std::vector<bf16> ones(8 * 64 * 64, to_bf16(0.01f));
  x.upload(ones.data(), x.size());
  w1.upload(ones.data(), w1.size());
  w3.upload(ones.data(), w3.size());
  w2.upload(ones.data(), w2.size());
  std::vector<float> g(T * 2, 0.5f);
  gates.upload(g.data(), gates.size());
  ForwardArgs a;
  a.x = {x.get(), DType::bf16, {T, 64}};
  a.topk_ids = {ids.get(), DType::i32, {T, 2}};
  a.topk_weights = {gates.get(), DType::f32, {T, 2}};
  a.w1 = {w1.get(), DType::bf16, {8, 64, 64}};
  a.w3 = {w3.get(), DType::bf16, {8, 64, 64}};
  a.w2 = {w2.get(), DType::bf16, {8, 64, 64}};
  a.y = {y.get(), DType::bf16, {T, 64}};
  a.saved = saved.get();
  a.saved_bytes = saved.size();
  a.scratch = scratch.get();
  a.scratch_bytes = scratch.size();
  a.check_routing = true;
  Stream stream;
  auto run_with = [&](int bad_slot, int value) {
    std::vector<int32_t> h(T * 2);
    for (int64_t t = 0; t < T; ++t) {
      h[t * 2] = static_cast<int32_t>(t % 8);
      h[t * 2 + 1] = static_cast<int32_t>((t + 3) % 8);
    }
    if (bad_slot >= 0) h[bad_slot] = value;
    ids.upload(h.data(), ids.size());
    layer.forward(a, stream.get());
  };
  CHECK_NOTHROW(run_with(-1, 0));
  try {
    run_with(17, 8);  // id 8 with E = 8
    FAIL("an out-of-range id was accepted");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument == "topk_ids");
    CHECK(std::string(e.what()).find("outside [0, 8)") != std::string::npos);
  }
  try {
    run_with(11, 5);  // token 5 picks expert (5+3)%8 = 0 ... and now 5 twice
    FAIL("a repeated expert was accepted");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument == "topk_ids");
    CHECK(std::string(e.what()).find("twice") != std::string::npos);
  }
  try {
    run_with(0, -1);
    FAIL("a negative id was accepted");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument == "topk_ids");
  }
  stream.synchronize();  // and the context is still healthy (no illegal address)
  CHECK_NOTHROW(run_with(-1, 0));
  stream.synchronize();
}
