// The autotuner: for a layer and token buckets, compile every candidate tile of every GEMM
// family into the cache (parallel threads, failures recorded, never fatal), then on a GPU
// check each candidate's outputs against the default kernels' before timing it, time the
// candidates interleaved (CUDA events around the family's launches inside real layer
// passes, warm-up by time, median of >= 10 samples, activations rotated beyond 2x L2), and
// store every measurement and the winner. A winner must beat the default by more than the
// measured noise, so a tuned layer is never slower than the default.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "generator/kernel_spec.hpp"

namespace moeblaze {

struct TuneOptions {
  LayerConfig layer;
  std::vector<int64_t> tokens;      // one tuning run per entry (its bucket is the key)
  std::string routing = "router";   // router | random | balanced | skewed
  double budget_s = 300;            // seconds of timing (compiling not counted) after which no new family is measured
  int samples = 10;                 // timed samples per candidate (at least 10)
  double warmup_ms = 200;           // warm-up by time before measuring
  int candidates_per_family = 12;  // plus each T's default tile where this cut leaves it out
  // The families to tune (empty: every tiled family of the layer, tunable_families); the others
  // keep what they have. Each must be a tiled family of the layer.
  std::vector<KernelFamily> families;
  // After a family's first timing, rounds of the winner's neighbours in the kernel layer's space
  // (generator/tile_space.hpp), compiled and timed beside the candidates so far, while the
  // budget lasts, the winner changes and the cost model gives a neighbour a chance. Off by
  // default until a GPU run has exercised it (`moeblaze tune --widen N`).
  int widen_rounds = 0;
  int widen_per_round = 4;
  uint64_t seed = 7;
  std::function<void(const std::string& line, bool transient)> progress;  // transient: may be overwritten
};

struct FamilyTuning {
  std::string family, winner, default_tile;
  int64_t token_bucket = 0;
  double winner_ms = 0, winner_spread = 0, default_ms = 0, default_spread = 0;
  int candidates = 0, failures = 0;
  int widened = 0;  // candidates the widening rounds added
  bool measured = false;
  std::string note;
};

struct TuneReport {
  std::string layer, device, policy;
  bool timed = false;
  std::string why_not_timed;
  int candidates = 0;  // candidate kernels listed, every family and tile
  int compiled = 0, from_cache = 0, compile_failures = 0;
  // Candidates that cannot run on the target (an illegal tile, a kernel that spills): recorded
  // as "illegal", expected, and no failure.
  int cannot_run = 0;
  int not_stored = 0;        // compiled, but the cache failed before it took them (cache_error)
  std::string cache_error;
  std::vector<std::string> compile_errors;  // the first few reasons, one line each
  std::vector<FamilyTuning> families;
  double step_default_ms = 0, step_tuned_ms = 0;  // fwd+bwd, median, interleaved
  double seconds = 0;          // the whole run
  double compile_seconds = 0;  // of it, compiling candidates (the first round and any widening)
  // "" when every candidate that can run here is compiled into the cache; else what fell
  // short: the counts of failed compiles and of unstored kernels, with the first reasons.
  std::string shortfall() const;
};

// Tunes into `cache`. Without a GPU: compiles every candidate into the cache and returns
// with timed = false and the reason. Compile and store failures never stop a tuning run: they
// are counted in the report (shortfall()), which a caller turns into its failure status.
TuneReport tune_layer(const TuneOptions& options, KernelCache& cache);

}  // namespace moeblaze
