// Prints a preset's layer and its save-h memory plan with the installed C++ library, in the
// keys `moeblaze plan --json` uses, so run.sh can compare the two.
#include <cstdio>

#include "moeblaze/core/errors.hpp"
#include "moeblaze/generator/heuristics.hpp"
#include "moeblaze/generator/layer_config.hpp"
#include "moeblaze/runtime/moe_layer.hpp"

int main(int argc, char** argv) {
  using namespace moeblaze;
  try {
    const Preset& p = find_preset(argc > 1 ? argv[1] : "qwen3-30b-a3b");
    const int dgrad_bn = default_tile(KernelFamily::down_dgrad, p.layer, Arch::sm_90a).bn;
    const MemoryPlan plan = plan_memory(p.layer, p.tokens, CheckpointMode::save_h, dgrad_bn);
    std::printf("layer %s\n", p.layer.describe().c_str());
    std::printf("saved_bytes %zu\n", plan.saved_bytes);
    std::printf("peak_bytes %zu\n", peak_bytes(plan, p.layer, p.tokens));
    return 0;
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "bad argument %s: %s\n", e.argument.c_str(), e.what());
    return 2;
  }
}
