// The C ABI (c_api.h) over the C++ library: conversions and exception-to-status mapping.
#include "c_api.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cache/kernel_cache.hpp"
#include "core/checked.hpp"
#include "generator/heuristics.hpp"
#include "runtime/cache_keys.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/kernel_build.hpp"
#include "runtime/moe_layer.hpp"
#include "runtime/toolchain.hpp"
#include "tuner/tuner.hpp"

struct mb_layer {
  std::unique_ptr<moeblaze::DeviceContext> context;
  std::unique_ptr<moeblaze::MoeLayer> layer;
  moeblaze::LoadReport report;
  std::vector<std::string> notices;  // the cache's notices and the load's warnings
};

namespace {

using namespace moeblaze;

thread_local std::string g_error, g_argument;

// The caller's progress callback (mb_set_progress_callback).
std::mutex g_progress_mutex;
mb_progress_fn g_progress = nullptr;
void* g_progress_user = nullptr;

// The layer mb_layer_create is loading on this thread, for the first progress line of its
// compiles (which comes on this thread, before the compile threads start).
thread_local std::string g_loading;

void say_progress(const std::string& line, bool transient) {
  mb_progress_fn fn;
  void* user;
  {
    std::lock_guard lock(g_progress_mutex);
    fn = g_progress;
    user = g_progress_user;
  }
  if (fn) fn(line.c_str(), transient ? 1 : 0, user);
}

template <class F>
int guarded(F&& f) {
  g_error.clear();
  g_argument.clear();
  try {
    f();
    return MB_OK;
  } catch (const InvalidArgument& e) {
    g_error = e.what();
    g_argument = e.argument;
    return MB_ERR_INVALID_ARGUMENT;
  } catch (const NoGpu& e) {
    g_error = e.what();
    return MB_ERR_NO_GPU;
  } catch (const CudaError& e) {
    g_error = e.what();
    return MB_ERR_CUDA;
  } catch (const CompileError& e) {
    g_error = e.what();
    return MB_ERR_COMPILE;
  } catch (const CacheError& e) {
    g_error = e.what();
    return MB_ERR_CACHE;
  } catch (const std::exception& e) {
    g_error = e.what();
    return MB_ERR_OTHER;
  } catch (...) {
    g_error = "unknown error";
    return MB_ERR_OTHER;
  }
}

void need(const void* p, const char* name) {
  if (!p) throw InvalidArgument(name, "is a null pointer");
}

LayerConfig to_layer(const mb_layer_config* c) {
  need(c, "config");
  LayerConfig l;
  l.shape = {c->experts, c->topk, c->hidden, c->ffn};
  if (c->activation < MB_SWIGLU || c->activation > MB_CLAMPED_SWIGLU)
    throw InvalidArgument("activation", fmt::format("{} is not an mb_activation", c->activation));
  if (c->router < MB_ROUTER_NONE || c->router > MB_ROUTER_SIGMOID)
    throw InvalidArgument("router", fmt::format("{} is not an mb_router", c->router));
  l.activation = static_cast<Activation>(c->activation);
  l.router = static_cast<RouterKind>(c->router);
  l.renormalize = c->renormalize != 0;
  l.route_scale = c->route_scale;
  if (c->weight_layout < MB_WEIGHTS_SEPARATE || c->weight_layout > MB_WEIGHTS_FUSED_GATE_UP)
    throw InvalidArgument("weight_layout", fmt::format("{} is not an mb_weight_layout", c->weight_layout));
  l.weight_layout = static_cast<WeightLayout>(c->weight_layout);
  l.expert_bias = c->expert_bias != 0;
  l.validate();
  return l;
}

mb_layer_config from_layer(const LayerConfig& l) {
  return mb_layer_config{l.shape.experts,
                         l.shape.topk,
                         l.shape.hidden,
                         l.shape.ffn,
                         static_cast<int32_t>(l.activation),
                         static_cast<int32_t>(l.router),
                         l.renormalize ? 1 : 0,
                         l.route_scale,
                         static_cast<int32_t>(l.weight_layout),
                         l.expert_bias ? 1 : 0};
}

CheckpointMode to_mode(int32_t m) {
  if (m == MB_SAVE_H) return CheckpointMode::save_h;
  if (m == MB_RECOMPUTE) return CheckpointMode::recompute;
  throw InvalidArgument("mode", fmt::format("{} is not an mb_mode (0 save-h, 1 recompute)", m));
}

TensorRef to_tensor(const mb_tensor& t, const char* name) {
  TensorRef r;
  r.ptr = t.ptr;
  if (!t.ptr) return r;
  if (t.dtype < MB_BF16 || t.dtype > MB_I32) throw InvalidArgument(name, fmt::format("dtype code {} is unknown", t.dtype));
  if (t.ndim < 0 || t.ndim > 4) throw InvalidArgument(name, fmt::format("ndim {} is outside [0, 4]", t.ndim));
  r.dtype = static_cast<DType>(t.dtype);
  r.shape.assign(t.shape, t.shape + t.ndim);
  return r;
}

ForwardArgs to_forward(const mb_forward_args* a) {
  need(a, "args");
  ForwardArgs f;
  f.x = to_tensor(a->x, "x");
  f.topk_ids = to_tensor(a->topk_ids, "topk_ids");
  f.topk_weights = to_tensor(a->topk_weights, "topk_weights");
  f.w_router = to_tensor(a->w_router, "w_router");
  f.router_bias = to_tensor(a->router_bias, "router_bias");
  f.w1 = to_tensor(a->w1, "w1");
  f.w3 = to_tensor(a->w3, "w3");
  f.w2 = to_tensor(a->w2, "w2");
  f.y = to_tensor(a->y, "y");
  f.gates_out = to_tensor(a->gates_out, "gates_out");
  f.mode = to_mode(a->mode);
  f.check_routing = a->check_routing != 0;
  f.saved = a->saved;
  f.saved_bytes = a->saved_bytes;
  f.scratch = a->scratch;
  f.scratch_bytes = a->scratch_bytes;
  f.bias_up = to_tensor(a->bias_up, "bias_up");
  f.bias_down = to_tensor(a->bias_down, "bias_down");
  return f;
}

BackwardArgs to_backward(const mb_backward_args* a) {
  need(a, "args");
  BackwardArgs b;
  b.dy = to_tensor(a->dy, "dy");
  b.x = to_tensor(a->x, "x");
  b.topk_weights = to_tensor(a->topk_weights, "topk_weights");
  b.w_router = to_tensor(a->w_router, "w_router");
  b.router_bias = to_tensor(a->router_bias, "router_bias");
  b.w1 = to_tensor(a->w1, "w1");
  b.w3 = to_tensor(a->w3, "w3");
  b.w2 = to_tensor(a->w2, "w2");
  b.dx = to_tensor(a->dx, "dx");
  b.dw1 = to_tensor(a->dw1, "dw1");
  b.dw3 = to_tensor(a->dw3, "dw3");
  b.dw2 = to_tensor(a->dw2, "dw2");
  b.d_topk_weights = to_tensor(a->d_topk_weights, "d_topk_weights");
  b.dw_router = to_tensor(a->dw_router, "dw_router");
  b.scratch = a->scratch;
  b.scratch_bytes = a->scratch_bytes;
  b.accumulate = a->accumulate != 0;
  b.bias_up = to_tensor(a->bias_up, "bias_up");
  b.bias_down = to_tensor(a->bias_down, "bias_down");
  b.d_bias_up = to_tensor(a->d_bias_up, "d_bias_up");
  b.d_bias_down = to_tensor(a->d_bias_down, "d_bias_down");
  return b;
}

mb_state from_state(const ForwardState& s) {
  mb_state o{};
  o.layer = from_layer(s.layer);
  o.tokens = s.tokens;
  o.mode = s.mode == CheckpointMode::save_h ? MB_SAVE_H : MB_RECOMPUTE;
  o.complete = s.complete ? 1 : 0;
  o.layer_id = s.layer_id;
  o.saved = s.saved;
  o.saved_bytes = s.saved_bytes;
  o.expert_token_indices = s.expert_token_indices;
  o.expert_token_offsets = s.expert_token_offsets;
  o.token_expert_indices = s.token_expert_indices;
  o.token_index_map = s.token_index_map;
  o.tile_prefix = s.tile_prefix;
  o.expert_counts = s.expert_counts;
  o.status = s.status;
  o.H = s.H;
  return o;
}

ForwardState to_state(const mb_state* s) {
  need(s, "state");
  ForwardState o;
  o.layer = to_layer(&s->layer);
  o.tokens = s->tokens;
  o.mode = to_mode(s->mode);
  o.complete = s->complete != 0;
  o.layer_id = s->layer_id;
  o.saved = s->saved;
  o.saved_bytes = s->saved_bytes;
  o.expert_token_indices = s->expert_token_indices;
  o.expert_token_offsets = s->expert_token_offsets;
  o.token_expert_indices = s->token_expert_indices;
  o.token_index_map = s->token_index_map;
  o.tile_prefix = s->tile_prefix;
  o.expert_counts = s->expert_counts;
  o.status = s->status;
  o.H = s->H;
  return o;
}

mb_memory_plan to_plan(const MemoryPlan& p) {
  return mb_memory_plan{p.saved_bytes, p.forward_scratch_bytes, p.backward_scratch_bytes, p.h_floor_bytes,
                        p.index_bytes};
}

void copy_out(const std::string& s, char* buf, size_t size) {
  if (!buf || size == 0) throw InvalidArgument("buf", "needs room for the text");
  const size_t n = std::min(s.size(), size - 1);
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}

int dgrad_bn_default(const LayerConfig& l) { return default_tile(KernelFamily::down_dgrad, l, Arch::sm_90a).bn; }

// Token counts given to the library: T >= 1 and T*K within the slot limit (core/checked.hpp).
void check_tokens(int64_t tokens, const LayerConfig& l, const char* argument) {
  checked_token_slots(tokens, l.shape.topk, argument);
}

// The cache a layer loads from. A training process must never stop, nor touch the file, over
// a cache it cannot use: it runs without one and says why in the layer's notices.
std::unique_ptr<KernelCache> open_layer_cache(const char* cache_path, std::vector<std::string>& notices) {
  if (cache_path && !*cache_path) return nullptr;
  std::string path;
  try {
    path = cache_path ? cache_path : KernelCache::default_path();
    auto cache = std::make_unique<KernelCache>(path);
    notices.insert(notices.end(), cache->notices().begin(), cache->notices().end());
    return cache;
  } catch (const CacheError& e) {
    notices.push_back(fmt::format("running without the kernel cache (kernels are compiled, nothing is stored): {}",
                                  e.what()));
    return nullptr;
  }
}

// The specs of the layer's families that `families` names ("a,b"; NULL or "" for all).
std::vector<KernelSpec> chosen_specs(std::vector<KernelSpec> specs, const char* families) {
  if (!families || !*families) return specs;
  std::vector<KernelSpec> out;
  std::string list(families);
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, end - start);
    KernelFamily f;
    try {
      f = parse_family(name);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("families", e.reason);
    }
    auto it = std::find_if(specs.begin(), specs.end(), [&](const KernelSpec& s) { return s.family == f; });
    if (it == specs.end()) throw InvalidArgument("families", fmt::format("'{}' is not a kernel family of this layer", name));
    if (std::none_of(out.begin(), out.end(), [&](const KernelSpec& s) { return s.family == f; })) out.push_back(*it);
    start = end + 1;
  }
  return out;
}

nlohmann::json part_json(const ToolchainPart& p) {
  nlohmann::json j{{"paths", p.paths}, {"place", p.place}};
  if (!p.error.empty()) j["error"] = p.error;
  return j;
}

}  // namespace

extern "C" {

const char* mb_version(void) { return MOEBLAZE_VERSION; }
int mb_abi_version(void) { return MB_ABI_VERSION; }
const char* mb_last_error(void) { return g_error.c_str(); }
const char* mb_last_error_argument(void) { return g_argument.c_str(); }

int mb_gpu_available(void) {
  std::string why;
  const bool ok = gpu_available(&why);
  g_error = why;
  return ok ? 1 : 0;
}

int mb_config_validate(const mb_layer_config* config) {
  return guarded([&] { to_layer(config); });
}

int mb_config_describe(const mb_layer_config* config, char* buf, size_t size) {
  return guarded([&] { copy_out(to_layer(config).describe(), buf, size); });
}

int mb_plan_memory(const mb_layer_config* config, int64_t tokens, int32_t mode, mb_memory_plan* out) {
  return guarded([&] {
    need(out, "out");
    const LayerConfig l = to_layer(config);
    check_tokens(tokens, l, "tokens");
    // The smallest dgrad tile any candidate uses (64) needs the most partials: safe for tuned layers.
    MemoryPlan p = plan_memory(l, tokens, to_mode(mode), 64);
    *out = to_plan(p);
  });
}

int mb_validate_forward(const mb_layer_config* config, const mb_forward_args* args) {
  return guarded([&] {
    const LayerConfig l = to_layer(config);
    validate_forward_args(l, dgrad_bn_default(l), to_forward(args));
  });
}

int mb_validate_backward(const mb_layer_config* config, const mb_state* state, const mb_backward_args* args) {
  return guarded([&] {
    const LayerConfig l = to_layer(config);
    validate_backward_args(l, dgrad_bn_default(l), to_state(state), to_backward(args));
  });
}

int mb_layer_create(const mb_layer_config* config, int32_t device, const char* cache_path, int64_t tokens,
                    mb_layer** out) {
  return guarded([&] {
    need(out, "out");
    *out = nullptr;
    const LayerConfig l = to_layer(config);
    if (tokens != 0) check_tokens(tokens, l, "tokens");
    require_in_range(device, 0, 1023, "device");
    auto h = std::make_unique<mb_layer>();
    h->context = std::make_unique<DeviceContext>(device);
    std::unique_ptr<KernelCache> cache = open_layer_cache(cache_path, h->notices);
    LoadOptions lo;
    lo.tokens = tokens;
    lo.policy = measurement_policy("router");
    g_loading = l.describe();
    struct Forget {
      ~Forget() { g_loading.clear(); }
    } forget;
    auto set = std::make_shared<KernelSet>(load_kernels(l, h->context->info(), cache.get(), lo, &h->report));
    h->layer = std::make_unique<MoeLayer>(std::move(set));
    if (cache)  // notices added while loading (a binary that failed its checksum, ...)
      for (const auto& n : cache->notices())
        if (std::find(h->notices.begin(), h->notices.end(), n) == h->notices.end()) h->notices.push_back(n);
    h->notices.insert(h->notices.end(), h->report.warnings.begin(), h->report.warnings.end());
    *out = h.release();
  });
}

void mb_layer_destroy(mb_layer* layer) { delete layer; }

int mb_layer_notices(const mb_layer* layer, char* buf, size_t size) {
  return guarded([&] {
    need(layer, "layer");
    std::string s;
    for (const auto& n : layer->notices) s += n + "\n";
    copy_out(s, buf, size);
  });
}

int mb_layer_plan_memory(const mb_layer* layer, int64_t tokens, int32_t mode, mb_memory_plan* out) {
  return guarded([&] {
    need(layer, "layer");
    need(out, "out");
    *out = to_plan(layer->layer->memory_plan(tokens, to_mode(mode)));
  });
}

int mb_layer_report(const mb_layer* layer, char* buf, size_t size) {
  return guarded([&] {
    need(layer, "layer");
    std::string s = layer->layer->config().describe() + "; " + layer->report.summary();
    for (const auto& k : layer->report.kernels)
      if (is_tiled(k.family)) s += fmt::format("; {} {} ({})", to_string(k.family), k.tile.to_string(), to_string(k.tile_source));
    copy_out(s, buf, size);
  });
}

int mb_layer_forward(const mb_layer* layer, const mb_forward_args* args, uint64_t stream, mb_state* state) {
  return guarded([&] {
    need(layer, "layer");
    need(state, "state");
    layer->context->make_current();
    *state = from_state(layer->layer->forward(to_forward(args), reinterpret_cast<CUstream>(stream)));
  });
}

int mb_layer_backward(const mb_layer* layer, const mb_state* state, const mb_backward_args* args, uint64_t stream) {
  return guarded([&] {
    need(layer, "layer");
    layer->context->make_current();
    layer->layer->backward(to_state(state), to_backward(args), reinterpret_cast<CUstream>(stream));
  });
}

int mb_token_bucket(int64_t tokens, int64_t* bucket) {
  return guarded([&] {
    need(bucket, "bucket");
    if (tokens < 0) throw InvalidArgument("tokens", fmt::format("T = {} must not be negative", tokens));
    *bucket = token_bucket(tokens);
  });
}

int mb_tune(const mb_layer_config* config, const int64_t* tokens, int32_t n_tokens, const char* cache_path,
            double budget_s, char* buf, size_t size) {
  return guarded([&] {
    // Every argument is checked before anything is compiled: a bad buffer found after minutes
    // of tuning would lose the report.
    if (!buf || size == 0) throw InvalidArgument("buf", "needs room for the report");
    // "" is no cache, as for mb_layer_create; tuning stores into one, so it is refused.
    if (cache_path && !*cache_path)
      throw InvalidArgument("cache_path", "\"\" means no cache, and tuning stores into one: pass NULL for the "
                                          "default cache, or a path");
    TuneOptions o;
    o.layer = to_layer(config);
    if (n_tokens <= 0 || !tokens) throw InvalidArgument("tokens", "give at least one token count");
    require_in_range(n_tokens, 1, 64, "n_tokens");
    for (int i = 0; i < n_tokens; ++i) {
      check_tokens(tokens[i], o.layer, "tokens");
      o.tokens.push_back(tokens[i]);
    }
    // 0 keeps the default budget; anything else must be a finite, positive number of seconds.
    require_finite(budget_s, 0, kMaxBudgetSeconds, "budget_s");
    if (budget_s > 0) o.budget_s = budget_s;
    KernelCache cache(cache_path ? cache_path : KernelCache::default_path());
    if (!cache.writable()) throw CacheError(fmt::format("cache {} is read-only: tuning stores into it", cache.path()));
    o.progress = say_progress;
    const TuneReport r = tune_layer(o, cache);
    const std::string shortfall = r.shortfall();
    nlohmann::json j{{"layer", r.layer},        {"timed", r.timed},
                     {"why_not_timed", r.why_not_timed}, {"candidates", r.candidates}, {"compiled", r.compiled},
                     {"from_cache", r.from_cache}, {"compile_failures", r.compile_failures},
                     {"cannot_run", r.cannot_run}, {"not_stored", r.not_stored}, {"shortfall", shortfall},
                     {"step_default_ms", r.step_default_ms}, {"step_tuned_ms", r.step_tuned_ms},
                     {"db", cache.path()}};
    for (const auto& f : r.families)
      j["families"].push_back({{"family", f.family}, {"winner", f.winner}, {"winner_ms", f.winner_ms},
                               {"default_ms", f.default_ms}});
    // The report is written either way, so a caller can read what fell short.
    copy_out(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), buf, size);
    if (r.compile_failures > 0) throw CompileError("", "", "", {}, "tune: " + shortfall);
    if (!shortfall.empty()) throw CacheError("tune: " + shortfall);
  });
}

int mb_set_progress_callback(mb_progress_fn fn, void* user) {
  return guarded([&] {
    {
      std::lock_guard lock(g_progress_mutex);
      g_progress = fn;
      g_progress_user = user;
    }
    // Compiles outside mb_tune (a layer's first use) report through the process's listener.
    if (!fn) {
      set_build_progress_listener({});
      return;
    }
    set_build_progress_listener([](const BuildProgress& p) {
      if (p.done == 0)
        say_progress(fmt::format("compiling {} kernels{} with NVRTC (the cache keeps them)", p.total,
                                 g_loading.empty() ? "" : " of " + g_loading),
                     false);
      else say_progress(p.line(), p.done < p.total);
    });
  });
}

int mb_presets(char* buf, size_t size) {
  return guarded([&] {
    std::string s;
    for (const auto& p : presets()) s += p.name + "\n";
    copy_out(s, buf, size);
  });
}

int mb_preset(const char* name, mb_layer_config* config, int64_t* tokens) {
  return guarded([&] {
    need(name, "name");
    need(config, "config");
    need(tokens, "tokens");
    const Preset& p = find_preset(name);
    *config = from_layer(p.layer);
    *tokens = p.tokens;
  });
}

int mb_compile(const mb_layer_config* config, int64_t tokens, const char* families, const char* cache_path,
               char* buf, size_t size) {
  return guarded([&] {
    if (!buf || size == 0) throw InvalidArgument("buf", "needs room for the report");
    const LayerConfig l = to_layer(config);
    if (tokens != 0) check_tokens(tokens, l, "tokens");
    const Arch arch = Arch::sm_90a;
    const std::vector<KernelSpec> specs = chosen_specs(layer_kernel_specs(l, arch, tokens), families);
    std::vector<std::string> notices;
    std::unique_ptr<KernelCache> cache = open_layer_cache(cache_path, notices);
    BuildCounts counts;
    const std::vector<KernelBuild> built = build_kernels(specs, BuildOptions{cache.get(), 0, false}, &counts);
    nlohmann::json j{{"layer", l.describe()},          {"arch", to_string(arch)},
                     {"tokens", tokens},               {"nvrtc", nvrtc_version()},
                     {"db", cache ? cache->path() : ""}, {"compiled", counts.compiled},
                     {"from_cache", counts.from_cache}, {"failed", counts.failed},
                     {"not_stored", counts.not_stored}, {"compile_ms", counts.compile_ms},
                     {"notices", notices},             {"kernels", nlohmann::json::array()}};
    if (!counts.cache_error.empty()) j["cache_error"] = counts.cache_error;
    std::string first_error;
    for (size_t i = 0; i < built.size(); ++i) {
      const KernelSpec& s = specs[i];
      nlohmann::json k{{"family", to_string(s.family)}, {"tile", is_tiled(s.family) ? s.tile.to_string() : "-"}};
      if (built[i].kernel) {
        const BuiltKernel& b = *built[i].kernel;
        const ResourceReport& r = b.compiled.resources;
        k.update({{"kernel", b.compiled.kernel_name}, {"registers", r.registers},
                  {"spill_bytes", r.spill_store_bytes + r.spill_load_bytes}, {"stack", r.stack_bytes},
                  {"compile_ms", b.compiled.compile_ms}, {"from_cache", b.from_cache}});
      } else {
        const std::string error = built[i].error_text();
        k["error"] = error;
        if (first_error.empty()) first_error = error;
      }
      j["kernels"].push_back(std::move(k));
    }
    copy_out(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), buf, size);
    if (!first_error.empty())
      throw CompileError("", "", "", {}, fmt::format("{} of {} kernels failed (first: {})", counts.failed,
                                                     specs.size(), first_error));
  });
}

int mb_toolchain(char* buf, size_t size) {
  return guarded([&] {
    if (!buf || size == 0) throw InvalidArgument("buf", "needs room for the report");
    const ToolchainReport r = toolchain_report();
    const nlohmann::json j{{"nvrtc", part_json(r.nvrtc)},
                           {"nvrtc_version", r.nvrtc_version},
                           {"cuda_headers", part_json(r.cuda_headers)},
                           {"cutlass_headers", part_json(r.cutlass_headers)}};
    copy_out(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), buf, size);
  });
}

int mb_set_package_dirs(const char* const* cuda_roots, int32_t n_roots, const char* cutlass_include) {
  return guarded([&] {
    require_in_range(n_roots, 0, 64, "n_roots");
    if (n_roots > 0) need(cuda_roots, "cuda_roots");
    PackageDirs d;
    for (int32_t i = 0; i < n_roots; ++i) {
      need(cuda_roots[i], "cuda_roots");
      d.cuda_roots.emplace_back(cuda_roots[i]);
    }
    if (cutlass_include) d.cutlass_include = cutlass_include;
    register_package_dirs(d);
  });
}

}  // extern "C"
