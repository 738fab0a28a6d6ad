/* moeblaze C ABI: a small, stable C interface over the library, exported by
 * libmoeblaze_c.so. The Python package binds it with ctypes, so it needs no compilation
 * against torch and works across torch versions. Every function returns MB_OK (0) or an
 * error code; mb_last_error() and mb_last_error_argument() (thread-local) say what and
 * which argument. Pointers are device addresses (CUdeviceptr) as 64-bit integers; 0 means
 * "absent". */
#ifndef MOEBLAZE_C_API_H
#define MOEBLAZE_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MB_ABI_VERSION 4

#if defined(__GNUC__)
#define MB_API __attribute__((visibility("default")))
#else
#define MB_API
#endif

enum mb_status {
  MB_OK = 0,
  MB_ERR_INVALID_ARGUMENT = 1, /* mb_last_error_argument() names it */
  MB_ERR_NO_GPU = 2,
  MB_ERR_CUDA = 3,
  MB_ERR_COMPILE = 4,
  MB_ERR_CACHE = 5,
  MB_ERR_OTHER = 6
};

enum mb_dtype { MB_BF16 = 0, MB_F32 = 1, MB_I32 = 2 };
/* MB_CLAMPED_SWIGLU: GPT-OSS's, h = min(a,7) sigmoid(1.702 min(a,7)) (clamp(b,-7,7) + 1). */
enum mb_activation { MB_SWIGLU = 0, MB_GEGLU = 1, MB_SILU = 2, MB_GELU = 3, MB_RELU = 4, MB_CLAMPED_SWIGLU = 5 };
enum mb_router { MB_ROUTER_NONE = 0, MB_ROUTER_SOFTMAX = 1, MB_ROUTER_SIGMOID = 2 };
enum mb_mode { MB_SAVE_H = 0, MB_RECOMPUTE = 1 };
/* W1/W3 as two [E,n,d] tensors, or one fused gate_up [E,2n,d] passed as w1 (w3 absent; the
 * Hugging Face layout: each expert's W1 rows, then its W3 rows); dw1 likewise. */
enum mb_weight_layout { MB_WEIGHTS_SEPARATE = 0, MB_WEIGHTS_FUSED_GATE_UP = 1 };

typedef struct {
  uint64_t ptr;      /* device address, 0 = absent */
  int32_t dtype;     /* mb_dtype */
  int32_t ndim;      /* 0..4 */
  int64_t shape[4];
} mb_tensor;

typedef struct {
  int32_t experts, topk, hidden, ffn;
  int32_t activation; /* mb_activation */
  int32_t router;     /* mb_router */
  int32_t renormalize;
  float route_scale;
  int32_t weight_layout; /* mb_weight_layout */
  int32_t expert_bias;   /* 1: per-expert biases bias_up [E, G*n] and bias_down [E, d] (GPT-OSS) */
} mb_layer_config;

typedef struct {
  uint64_t saved_bytes, forward_scratch_bytes, backward_scratch_bytes, h_floor_bytes, index_bytes;
} mb_memory_plan;

typedef struct {
  mb_tensor x, topk_ids, topk_weights, w_router, router_bias, w1, w3, w2, y, gates_out;
  int32_t mode;      /* mb_mode */
  int32_t check_routing;
  uint64_t saved, saved_bytes, scratch, scratch_bytes;
  mb_tensor bias_up, bias_down; /* layers with expert biases; bf16 */
} mb_forward_args;

typedef struct {
  mb_tensor dy, x, topk_weights, w_router, router_bias, w1, w3, w2;
  mb_tensor dx, dw1, dw3, dw2, d_topk_weights, dw_router;
  uint64_t scratch, scratch_bytes;
  /* 1: bf16 dw1/dw3/dw2 are added to (gradient accumulation in the GEMM epilogues); 0: they are
   * overwritten. f32 weight gradients are always added to. */
  int32_t accumulate;
  /* layers with expert biases: the biases (bias_up for recompute mode) and their gradients (the
   * dtype of dw1, stored or added like it) */
  mb_tensor bias_up, bias_down, d_bias_up, d_bias_down;
} mb_backward_args;

/* What forward leaves for backward: a plain value the caller keeps (e.g. in an autograd
 * context) together with the saved buffer it points into. */
typedef struct {
  mb_layer_config layer;
  int64_t tokens;
  int32_t mode, complete;
  uint64_t layer_id, saved, saved_bytes;
  uint64_t expert_token_indices, expert_token_offsets, token_expert_indices, token_index_map, tile_prefix,
      expert_counts, status, H;
} mb_state;

typedef struct mb_layer mb_layer;

MB_API const char* mb_version(void);
MB_API int mb_abi_version(void);
MB_API const char* mb_last_error(void);
MB_API const char* mb_last_error_argument(void);
/* 1 when a GPU can be used; else 0 and the reason in mb_last_error(). */
MB_API int mb_gpu_available(void);

/* No GPU needed. */
MB_API int mb_config_validate(const mb_layer_config* config);
MB_API int mb_config_describe(const mb_layer_config* config, char* buf, size_t size);
MB_API int mb_plan_memory(const mb_layer_config* config, int64_t tokens, int32_t mode, mb_memory_plan* out);
MB_API int mb_validate_forward(const mb_layer_config* config, const mb_forward_args* args);
MB_API int mb_validate_backward(const mb_layer_config* config, const mb_state* state, const mb_backward_args* args);

/* The layer on a GPU: kernels loaded from the cache (tuned tiles, cached binaries; NVRTC
 * on a miss). cache_path: NULL = the default cache, "" = no cache (default tiles); a cache
 * that cannot be used is never changed: the layer runs without it (mb_layer_notices says
 * why). tokens: the token count to look tuned tiles up for (0: none). The primary context of
 * `device` is made current (the one the CUDA runtime and PyTorch use). */
MB_API int mb_layer_create(const mb_layer_config* config, int32_t device, const char* cache_path, int64_t tokens,
                    mb_layer** out);
MB_API void mb_layer_destroy(mb_layer* layer);
/* What the layer's creation noticed without failing, one line each ("" when nothing): a cache
 * that could not be used (the layer then compiles its kernels and stores nothing), a read-only
 * cache, a tuned winner that was not a tile (the default tile runs instead). */
MB_API int mb_layer_notices(const mb_layer* layer, char* buf, size_t size);
MB_API int mb_layer_plan_memory(const mb_layer* layer, int64_t tokens, int32_t mode, mb_memory_plan* out);
MB_API int mb_layer_report(const mb_layer* layer, char* buf, size_t size);
/* stream: a CUstream / cudaStream_t as an integer (0 = the legacy default stream). */
MB_API int mb_layer_forward(const mb_layer* layer, const mb_forward_args* args, uint64_t stream, mb_state* state);
/* Consumes the state: in save-h mode the saved buffer's H becomes dH (one backward per forward). */
MB_API int mb_layer_backward(const mb_layer* layer, const mb_state* state, const mb_backward_args* args, uint64_t stream);

/* The token bucket of a token count (a power of two, 1 for tokens 0 and 1): tuned tiles are
 * stored and looked up per bucket, so a binding keeps one loaded layer per bucket. */
MB_API int mb_token_bucket(int64_t tokens, int64_t* bucket);

/* Tunes the layer for the token counts (1..64 of them, each T >= 1 with T*K < 2^31) into the
 * cache (compile-only without a GPU); budget_s: seconds of timing (compiling not counted), finite,
 * 0 = the default. cache_path:
 * NULL = the default cache; "" means no cache, as for mb_layer_create, and is refused
 * (MB_ERR_INVALID_ARGUMENT: tuning stores into a cache). buf and size are checked before
 * anything is compiled. The report (JSON, cut to size - 1 bytes) is written to buf, also when
 * the call fails because candidates fell short: MB_ERR_COMPILE when any failed to compile,
 * MB_ERR_CACHE when the cache failed to store some (mb_last_error() gives the counts and the
 * first reasons; the report's "shortfall" too). */
MB_API int mb_tune(const mb_layer_config* config, const int64_t* tokens, int32_t n_tokens, const char* cache_path,
            double budget_s, char* buf, size_t size);

/* Progress of work that takes seconds to minutes (compiling a layer's kernels in
 * mb_layer_create, every phase of mb_tune): one line of text, transient = 1 for a line that
 * the next one replaces (a count with an estimate), 0 for a lasting one (a phase). Called on
 * the working thread or on the library's compile threads, one call at a time; the callback
 * must not call back into the library. NULL turns it off. One callback for the process. */
typedef void (*mb_progress_fn)(const char* line, int32_t transient, void* user);
MB_API int mb_set_progress_callback(mb_progress_fn fn, void* user);

/* The model presets (`moeblaze presets`): their names, one a line, the benchmark suite first. */
MB_API int mb_presets(char* buf, size_t size);
/* A preset's layer and its token count. An unknown name is MB_ERR_INVALID_ARGUMENT naming
 * "preset", the message listing the known names. */
MB_API int mb_preset(const char* name, mb_layer_config* config, int64_t* tokens);

/* Generates and NVRTC-compiles the layer's kernels, as `moeblaze generate` does (no GPU needed):
 * the default tiles for `tokens` (0: the rule without a token count), for every family of the
 * layer or only the comma-separated `families` (NULL or "": all; a name that is not one of the
 * layer's families is MB_ERR_INVALID_ARGUMENT naming "families"). cache_path: NULL = the default
 * cache, "" = no cache; kernels already in the cache are taken from it and compiled ones stored
 * (a cache that cannot be used is left out, and the report says why). The report (JSON: layer,
 * arch, nvrtc, counts, and per kernel its family, name, tile, registers, spill bytes, compile_ms,
 * from_cache, or its error) is written to buf, also when the call fails because a kernel did not
 * compile (MB_ERR_COMPILE; mb_last_error() gives the first error). */
MB_API int mb_compile(const mb_layer_config* config, int64_t tokens, const char* families, const char* cache_path,
                      char* buf, size_t size);

/* Where the kernels' compiler comes from (runtime/toolchain.hpp): JSON with, for "nvrtc",
 * "cuda_headers" and "cutlass_headers", the paths found and the place that gave them, or the
 * error naming every place looked; and "nvrtc_version". Opens NVRTC if it is not yet open. */
MB_API int mb_toolchain(char* buf, size_t size);
/* NVIDIA's PyPI packages as the host program found them: n_roots folders holding include/ and
 * lib/ of nvidia-cuda-nvrtc, -runtime, -cccl and -crt (site-packages/nvidia/cu13), and the
 * folder of nvidia-cutlass's headers (NULL or "": none). Every later search takes them first
 * among the packages, after CUDA_HOME and CUDA_PATH. The Python package calls this when it loads
 * the library; NVRTC, once opened, stays. */
MB_API int mb_set_package_dirs(const char* const* cuda_roots, int32_t n_roots, const char* cutlass_include);

#ifdef __cplusplus
}
#endif
#endif
