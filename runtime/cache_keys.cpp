#include "cache_keys.hpp"

#include <fmt/format.h>

#include "core/errors.hpp"
#include "generator/embedded_templates.hpp"

namespace moeblaze {

std::string binary_key(const GeneratedKernel& g, const CompileOptions& options) {
  std::string extra;
  for (const auto& o : options.extra) extra += " " + o;
  // The CUDA include folder is not part of the key: only the NVRTC version is (headers
  // ship with it).
  return fmt::format("generator=v{};templates={:016x};kernel={};layer={};tile={};threads={};smem={};arch={};"
                     "options=-std=c++17 -default-device -lineinfo -DNDEBUG{};nvrtc={}",
                     kGeneratorVersion, templates_hash(), g.spec.name(), g.spec.layer.describe(),
                     is_tiled(g.spec.family) ? g.spec.tile.to_string() : "-", g.threads, g.dynamic_smem, to_string(options.arch),
                     extra, nvrtc_version()) +
         // CUTLASS's headers are not embedded: the release they come from keys the kernels that use them.
         (g.source.needs_cutlass ? fmt::format(";cutlass={}", kCutlassVersion) : "");
}

int64_t token_bucket(int64_t tokens) {
  constexpr int64_t kLargestBucket = int64_t{1} << 62;
  if (tokens > kLargestBucket)
    throw InvalidArgument("tokens", fmt::format("T = {} is above the largest token bucket, 2^62", tokens));
  int64_t b = 1;
  while (b < tokens) b <<= 1;
  return b;
}

std::string device_fingerprint(const DeviceInfo& i) {
  return fmt::format("{}|cc{}.{}|{}sm|driver{}", i.name, i.cc_major, i.cc_minor, i.sm_count, i.driver_version);
}

std::string measurement_policy(const std::string& routing) {
  return fmt::format("routing={};l2=rotated;timing=events-median", routing);
}

TuningKey tuning_key(KernelFamily family, const LayerConfig& layer, int64_t bucket, const std::string& device,
                     const std::string& policy) {
  TuningKey k;
  k.family = to_string(family);
  k.template_hash = fmt::format("{:016x}", templates_hash());
  k.shape = layer.describe();
  k.token_bucket = bucket;
  k.device = device;
  k.policy = policy;
  return k;
}

std::string tuning_row_problem(const std::string& family, const std::string& config) {
  KernelFamily f;
  try {
    f = parse_family(family);
  } catch (const InvalidArgument&) {
    return "unknown kernel family";
  }
  if (!is_tiled(f)) return "not a tuned kernel family";
  try {
    TileConfig::parse(config);
  } catch (const InvalidArgument&) {
    return "unparsable tile";
  }
  return "";
}

CachedBinary to_cached(const BuiltKernel& k, const std::string& key) {
  CachedBinary c;
  c.key = key;
  c.key_hash = key_hash(key);
  c.kernel_name = k.compiled.kernel_name;
  c.arch = k.compiled.arch;
  c.nvrtc_version = nvrtc_version();
  c.cubin = k.compiled.cubin;
  c.registers = k.compiled.resources.registers;
  c.spill_bytes = k.compiled.resources.spill_store_bytes + k.compiled.resources.spill_load_bytes;
  c.static_smem = k.compiled.resources.static_smem_bytes;
  c.dynamic_smem = k.generated.dynamic_smem;
  c.threads = k.generated.threads;
  c.log = k.compiled.log;
  return c;
}

BuiltKernel from_cached(const GeneratedKernel& g, const CachedBinary& c) {
  BuiltKernel k;
  k.generated = g;
  k.compiled.kernel_name = c.kernel_name;
  k.compiled.arch = c.arch;
  k.compiled.cubin = c.cubin;
  k.compiled.log = c.log;
  k.compiled.resources = kernel_resources(c.log, c.cubin, c.kernel_name);
  k.from_cache = true;
  return k;
}

}  // namespace moeblaze
