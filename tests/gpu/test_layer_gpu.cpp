// GPU tests: the whole layer against the CPU reference over a table of cases (shapes,
// activations, routers, routing distributions, checkpoint modes). Exit code 77 (CTest:
// skipped) with a message when no GPU is present. Label: gpu.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdio>

#include "cuda_driver.hpp"
#include "layer_check.hpp"

using namespace moeblaze;

int moeblaze_test_main_hook(int argc, char** argv) {
  std::string why;
  if (!gpu_available(&why)) {
    std::printf("SKIPPED: GPU tests need a GPU: %s\n", why.c_str());
    return 77;
  }
  (void)argc;
  (void)argv;
  return -1;  // run doctest
}

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
      o.tokens = c.tokens;
      o.routing = c.routing;
      o.mode = c.mode;
      o.accumulate_fp32 = c.accumulate;
      o.sample_tokens = 512;
      o.sample_experts = 4;
      const LayerCheckResult r = run_layer_check(o);
      INFO(c.name);
      for (const auto& e : r.errors) {
        INFO(e.name, " rel error ", e.rel_error);
        if (e.exact) CHECK(e.rel_error == 0);
        else CHECK(e.rel_error <= o.tolerance);
      }
      INFO("unwritten: ", r.unwritten, "; differs: ", r.differs);
      CHECK(r.all_written);
      CHECK(r.bitwise_identical);
      MESSAGE(fmt::format("{}: max rel error {:.2e}, fwd {:.3f} ms, bwd {:.3f} ms", c.name, r.max_error(),
                          r.forward_ms, r.backward_ms));
    }
  }
}
