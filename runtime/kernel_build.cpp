#include "kernel_build.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <mutex>

#include "cache_keys.hpp"
#include "compile_processes.hpp"
#include "core/parallel.hpp"

namespace moeblaze {

std::string KernelBuild::error_text() const {
  if (!error) return {};
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

namespace {

std::string duration_text(double s) {
  const long long r = std::llround(s);
  return r >= 60 ? fmt::format("{}m{:02}s", r / 60, r % 60) : fmt::format("{}s", r);
}

std::mutex listener_mutex;
BuildProgressFn& listener() {
  static BuildProgressFn fn;
  return fn;
}

}  // namespace

std::string BuildProgress::line(const std::string& what) const {
  std::string out = fmt::format("compiled {} of {} {}, {}", done, total, what, duration_text(seconds));
  // The rate so far: compiles of one build take alike long.
  if (done > 0 && done < total) out += fmt::format(", about {} left", duration_text(seconds / done * (total - done)));
  return out;
}

void set_build_progress_listener(BuildProgressFn fn) {
  std::lock_guard lock(listener_mutex);
  listener() = std::move(fn);
}

std::shared_ptr<LoadedModule> load_module(const BuiltKernel& k) {
  return std::make_shared<LoadedModule>(k.compiled.cubin, k.compiled.kernel_name, k.generated.dynamic_smem,
                                        k.generated.threads, k.generated.spec.cluster_size());
}

std::vector<KernelBuild> build_kernels(const std::vector<KernelSpec>& specs, const BuildOptions& o,
                                       BuildCounts* counts) {
  std::vector<KernelBuild> out(specs.size());
  std::vector<GeneratedKernel> generated(specs.size());
  std::vector<std::string> keys(specs.size());
  std::vector<size_t> misses;
  KernelCache* cache = o.cache;
  const bool stores = cache && cache->writable();
  int not_stored = 0;  // under cache_mutex
  std::string cache_error;
  std::mutex cache_mutex;  // one connection, used by one thread at a time
  auto drop_cache = [&](const CacheError& e) {
    if (cache_error.empty()) cache_error = e.what();
    cache = nullptr;
  };
  // Generation and lookups are quick: on this thread.
  for (size_t i = 0; i < specs.size(); ++i) {
    try {
      generated[i] = generate(specs[i]);
      keys[i] = binary_key(generated[i], CompileOptions{specs[i].arch, {}});
      std::optional<CachedBinary> hit;
      try {
        if (cache && !o.keep_ptx) hit = cache->find_binary(key_hash(keys[i]), keys[i]);
      } catch (const CacheError& e) {
        drop_cache(e);
      }
      if (hit) out[i].kernel = from_cached(generated[i], *hit);
      else misses.push_back(i);
    } catch (...) {
      out[i].error = std::current_exception();
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  BuildProgressFn progress = o.progress;
  if (!progress) {
    std::lock_guard lock(listener_mutex);
    progress = listener();
  }
  std::mutex progress_mutex;
  int done = 0;  // under progress_mutex
  auto report = [&](bool one_more) {
    if (!progress) return;
    std::lock_guard lock(progress_mutex);
    done += one_more;
    progress(BuildProgress{done, static_cast<int>(misses.size()),
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
  };
  if (!misses.empty()) {
    try {
      report(false);
    } catch (...) {
    }
  }
  // One compiled kernel: into the cache (one connection: one thread at a time) and the result.
  auto keep = [&](size_t i, CompiledKernel&& compiled) {
    BuiltKernel b;
    b.generated = generated[i];
    b.compiled = std::move(compiled);
    {
      std::lock_guard lock(cache_mutex);
      bool stored = false;
      try {
        if (cache && cache->writable()) {
          cache->put_binary(to_cached(b, keys[i]));
          stored = true;
        }
      } catch (const CacheError& e) {
        drop_cache(e);
      }
      if (stores && !stored) ++not_stored;
    }
    out[i].kernel = std::move(b);
  };
  // A progress callback that throws must not count as a kernel's failure.
  auto reported = [&] {
    try {
      report(true);
    } catch (...) {
    }
  };
  if (compile_in_processes() && misses.size() > 1) {
    std::vector<const KernelSource*> sources;
    std::vector<CompileOptions> options;
    for (size_t i : misses) {
      sources.push_back(&generated[i].source);
      options.push_back(CompileOptions{specs[i].arch, {}, o.keep_ptx});
    }
    compile_forked(sources, options, o.threads, [&](size_t m, CompiledKernel* kernel, std::exception_ptr error) {
      const size_t i = misses[m];
      try {
        if (error) std::rethrow_exception(error);
        keep(i, std::move(*kernel));
      } catch (...) {
        out[i].error = std::current_exception();
      }
      reported();
    });
  } else {
    parallel_tasks(static_cast<int64_t>(misses.size()), [&](int64_t m) {
      const size_t i = misses[m];
      try {
        keep(i, compile_kernel(generated[i].source, CompileOptions{specs[i].arch, {}, o.keep_ptx}));
      } catch (...) {
        out[i].error = std::current_exception();
      }
      reported();
    }, o.threads);
  }
  if (counts) {
    if (counts->cache_error.empty()) counts->cache_error = cache_error;
    counts->not_stored += not_stored;
    if (!misses.empty())
      counts->compile_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (const KernelBuild& b : out) {
      if (!b.kernel) ++counts->failed;
      else if (b.kernel->from_cache) ++counts->from_cache;
      else ++counts->compiled;
    }
  }
  return out;
}

std::vector<BuiltKernel> build_all(const std::vector<KernelSpec>& specs, const BuildOptions& o, BuildCounts* counts) {
  std::vector<KernelBuild> builds = build_kernels(specs, o, counts);
  std::vector<BuiltKernel> out;
  out.reserve(builds.size());
  for (KernelBuild& b : builds) {
    if (b.error) std::rethrow_exception(b.error);
    out.push_back(std::move(*b.kernel));
  }
  return out;
}

std::vector<BuiltKernel> compile_all(const std::vector<KernelSpec>& specs, unsigned threads, bool keep_ptx) {
  return build_all(specs, BuildOptions{nullptr, threads, keep_ptx});
}

}  // namespace moeblaze
