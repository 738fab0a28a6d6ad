// The keys under which binaries and tuning results are cached (docs/design.md "Cache keys").
#pragma once
#include <string>

#include "cache/kernel_cache.hpp"
#include "cuda_driver.hpp"
#include "kernel_set.hpp"
#include "generator/kernel_spec.hpp"
#include "nvrtc_compiler.hpp"

namespace moeblaze {

// Everything that changes a binary: generator version, template hash, the specialisation
// (family, every shape parameter, tile), launch geometry, normalised NVRTC options, exact
// target and NVRTC version.
std::string binary_key(const GeneratedKernel& g, const CompileOptions& options);

// Tokens rounded up to a power of two (the dynamic dimension's bucket).
int64_t token_bucket(int64_t tokens);

// "NVIDIA H200|cc9.0|132sm|driver13000": what a timing is valid on.
std::string device_fingerprint(const DeviceInfo& info);

// Measurement policy of the tuner: routing distribution and L2 treatment.
std::string measurement_policy(const std::string& routing);

TuningKey tuning_key(KernelFamily family, const LayerConfig& layer, int64_t bucket, const std::string& device,
                     const std::string& policy);

// The generator's checks of a tuning row read from a file (KernelCache::import_from,
// KernelCache::salvage): "" when `family` is a tuned kernel family and `config` a tile name
// that parses, else a short reason without the row's text.
std::string tuning_row_problem(const std::string& family, const std::string& config);

// Cache rows <-> pipeline values.
CachedBinary to_cached(const BuiltKernel& k, const std::string& key);
BuiltKernel from_cached(const GeneratedKernel& g, const CachedBinary& c);

}  // namespace moeblaze
