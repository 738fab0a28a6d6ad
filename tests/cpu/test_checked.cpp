// The one range, finiteness and overflow check (core/checked.hpp) and the places that rely
// on it, no GPU: layer configs, memory plans, forward/backward validation and tile names with
// values at and past their limits, NaN and infinities, and products that overflow 64 bits.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/checked.hpp"
#include "core/errors.hpp"
#include "generator/kernel_spec.hpp"
#include "generator/layer_config.hpp"
#include "runtime/moe_layer.hpp"

using namespace moeblaze;

namespace {

template <class F>
std::string invalid_argument_of(F&& fn, const std::string& argument) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    CHECK(e.argument == argument);
    return e.what();
  }
  FAIL("expected InvalidArgument for " << argument);
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

LayerConfig layer(int E, int K, int d, int n) {
  LayerConfig l;
  l.shape = {E, K, d, n};
  return l;
}

}  // namespace

TEST_CASE("checked: ranges, finiteness, products") {
  CHECK(require_in_range(5, 1, 5, "a") == 5);
  CHECK(has(invalid_argument_of([] { require_in_range(6, 1, 5, "--a", "X"); }, "--a"), "X = 6 is outside [1, 5]"));
  CHECK(has(invalid_argument_of([] { require_in_range(INT64_MIN, 0, 1, "a"); }, "a"), "outside"));
  CHECK(require_finite(0.5, 0, 1, "r") == 0.5);
  for (double bad : {std::nan(""), double(INFINITY), -double(INFINITY)})
    CHECK(has(invalid_argument_of([&] { require_finite(bad, -1e300, 1e300, "--r"); }, "--r"), "not a finite number"));
  CHECK(has(invalid_argument_of([] { require_finite(1e13, 0, 1048576, "--max-mb"); }, "--max-mb"), "outside [0, 1048576]"));
  CHECK(has(invalid_argument_of([] { require_finite(-0.1, 0, 1, "r"); }, "r"), "outside"));
  CHECK(checked_mul(int64_t{1} << 31, 1 << 16, "p", "T*n") == int64_t{1} << 47);
  CHECK(has(invalid_argument_of([] { checked_mul(int64_t{1} << 60, 16, "p", "T*K"); }, "p"), "T*K = "));
  CHECK(has(invalid_argument_of([] { checked_mul(INT64_MIN, -1, "p", "x"); }, "p"), "overflows"));
  CHECK(checked_token_slots(134217727, 16, "tokens") == 134217727LL * 16);
  CHECK(has(invalid_argument_of([] { checked_token_slots(134217728, 16, "tokens"); }, "tokens"), "below 2^31"));
  // 2^60 x 16 wraps to 0 in 64 bits: refused, not a zero-byte plan.
  CHECK(has(invalid_argument_of([] { checked_token_slots(int64_t{1} << 60, 16, "tokens"); }, "tokens"), "2^31"));
  CHECK(has(invalid_argument_of([] { checked_token_slots(INT64_MAX, 2, "tokens"); }, "tokens"), "2^31"));
  CHECK(has(invalid_argument_of([] { checked_token_slots(0, 2, "tokens"); }, "tokens"), "at least 1"));
  CHECK(has(invalid_argument_of([] { checked_token_slots(-5, 2, "tokens"); }, "tokens"), "at least 1"));
}

TEST_CASE("checked: layer configs at and past their limits") {
  CHECK_NOTHROW(layer(512, 16, kMaxWidth, kMaxWidth).validate());
  CHECK(has(invalid_argument_of([] { layer(8, 2, 2147483640, 64).validate(); }, "hidden"), "outside [8, 65536]"));
  CHECK(has(invalid_argument_of([] { layer(8, 2, 64, kMaxWidth + 8).validate(); }, "ffn"), "outside"));
  CHECK(has(invalid_argument_of([] { layer(-8, 2, 64, 64).validate(); }, "experts"), "E = -8"));
  for (float scale : {std::numeric_limits<float>::infinity(), std::nanf(""), -1.f, 0.f, 2e6f}) {
    LayerConfig l = layer(8, 2, 64, 64);
    l.route_scale = scale;
    invalid_argument_of([&] { l.validate(); }, "route_scale");
  }
}

TEST_CASE("checked: memory plans and validation refuse overflowing token counts") {
  const LayerConfig l = layer(16, 16, 256, 256);
  invalid_argument_of([&] { plan_memory(l, int64_t{1} << 60, CheckpointMode::save_h, 128); }, "tokens");
  invalid_argument_of([&] { plan_memory(l, int64_t{1} << 27, CheckpointMode::save_h, 128); }, "tokens");
  const MemoryPlan p = plan_memory(l, (int64_t{1} << 27) - 1, CheckpointMode::save_h, 128);
  // The largest plan: H alone is T*K*2n*2 bytes, about 2^31 * 1 KiB.
  CHECK(p.h_floor_bytes == size_t((int64_t{1} << 27) - 1) * 16 * 2 * 256 * 2);
  CHECK(p.saved_bytes >= p.h_floor_bytes);
  LayerConfig bad = l;
  bad.shape.hidden = 2147483640;
  invalid_argument_of([&] { plan_memory(bad, 16, CheckpointMode::save_h, 128); }, "hidden");

  // A forward whose x claims 2^60 tokens with a 1 KiB saved buffer (accepted before).
  const int64_t T = int64_t{1} << 60;
  ForwardArgs a;
  const CUdeviceptr base = 0x7f0000000000ull;
  a.x = {base, DType::bf16, {T, 256}};
  a.topk_ids = {base + 0x1000, DType::i32, {T, 16}};
  a.topk_weights = {base + 0x2000, DType::f32, {T, 16}};
  a.w1 = {base + 0x3000, DType::bf16, {16, 256, 256}};
  a.w3 = {base + 0x4000, DType::bf16, {16, 256, 256}};
  a.w2 = {base + 0x5000, DType::bf16, {16, 256, 256}};
  a.y = {base + 0x6000, DType::bf16, {T, 256}};
  a.saved = base + 0x8000;
  a.saved_bytes = 1024;
  a.scratch = base + 0x9000;
  a.scratch_bytes = 1024;
  CHECK(has(invalid_argument_of([&] { validate_forward_args(l, 128, a); }, "x"), "2^31"));
  ForwardState s;
  s.layer = l;
  s.tokens = T;
  s.complete = true;
  s.saved = base + 0x8000;
  s.saved_bytes = 1024;
  invalid_argument_of([&] { validate_backward_args(l, 128, s, BackwardArgs{}); }, "state");
}

TEST_CASE("checked: tile names are read strictly, every number bounded") {
  const std::string full = "128x256x64_w8x1_s4_persist_tmacontig_tmastore_altorder";
  CHECK(TileConfig::parse(full).to_string() == full);
  for (const char* bad : {"64x64x64_w2147483648x1_s3", "64x64x64_w67108864x1_s3", "+128x128x64_w2x4_s3",
                          "128x128x64_w2x4_s3 ", " 128x128x64_w2x4_s3", "128x128x64_w-2x4_s3", "128x128x64_w2x4_s3_",
                          "128x128x64_w2x4_s3_tmacontig", "128x128x64_w2x4_s3_tma", "128x128x64_w2x4",
                          "", "x", "128x128x64_w2x4_s3\x1b[2J"})
    CHECK_MESSAGE(has(invalid_argument_of([&] { TileConfig::parse(bad); }, "tile"), "not of the form"), bad);
  CHECK(has(invalid_argument_of([] { TileConfig::parse("64x64x64_w99999x1_s3"); }, "tile"),
            "warps_m = 99999 is outside [1, 64]"));
  CHECK(has(invalid_argument_of([] { TileConfig::parse("2048x64x64_w2x1_s3"); }, "tile"), "bm = 2048"));
  CHECK(has(invalid_argument_of([] { TileConfig::parse("128x128x64_w2x4_s0"); }, "tile"), "stages = 0"));
  // Within the parse bounds, the legality check still refuses what cannot run.
  const LayerConfig l = layer(8, 2, 256, 256);
  CHECK_FALSE(legality_problem(KernelSpec{KernelFamily::gate_up, l, TileConfig::parse("64x64x64_w64x64_s3")}).empty());
}
