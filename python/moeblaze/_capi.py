"""ctypes binding of the moeblaze C ABI (capi/c_api.h).

The shared library is looked up in this order: $MOEBLAZE_LIBRARY, the package folder
(pip install), a source checkout's build folder: $MOEBLAZE_BUILD_DIR/lib (the folder
scripts/setup.sh builds into; relative to the checkout, as there), then build/lib."""
from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

ABI_VERSION = 4

# Codes of capi/c_api.h
OK, ERR_INVALID_ARGUMENT, ERR_NO_GPU, ERR_CUDA, ERR_COMPILE, ERR_CACHE, ERR_OTHER = range(7)
DTYPES = {"bf16": 0, "f32": 1, "i32": 2}
# clamped_swiglu: GPT-OSS's, h = m sigmoid(1.702 m) (clamp(b, -7, 7) + 1), m = min(a, 7).
ACTIVATIONS = {"swiglu": 0, "geglu": 1, "silu": 2, "gelu": 3, "relu": 4, "clamped_swiglu": 5}
GATED = ("swiglu", "geglu", "clamped_swiglu")
ROUTERS = {None: 0, "none": 0, "softmax": 1, "sigmoid": 2}
MODES = {"save-h": 0, "recompute": 1}
# "fused": one gate_up [E, 2n, d] (each expert's W1 rows, then its W3 rows), passed as w1.
WEIGHT_LAYOUTS = {"separate": 0, "fused": 1}


class MoeblazeError(RuntimeError):
    """A failure inside the library (CUDA, NVRTC, cache, ...)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class InvalidArgument(ValueError):
    """A bad argument; `argument` names it."""

    def __init__(self, argument: str, message: str):
        super().__init__(message)
        self.argument = argument


class NoGpu(MoeblazeError):
    """No usable GPU: no driver (libcuda), no device, or the driver refused to start. Raised by
    the calls that run kernels; everything else (make_config, plan_memory, describe, compiling
    and tuning into the cache without timing) works without a GPU. `gpu_available()` asks first."""


class Tensor(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_uint64), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4)]


class LayerConfig(ctypes.Structure):
    _fields_ = [("experts", ctypes.c_int32), ("topk", ctypes.c_int32), ("hidden", ctypes.c_int32),
                ("ffn", ctypes.c_int32), ("activation", ctypes.c_int32), ("router", ctypes.c_int32),
                ("renormalize", ctypes.c_int32), ("route_scale", ctypes.c_float), ("weight_layout", ctypes.c_int32),
                ("expert_bias", ctypes.c_int32)]


class MemoryPlan(ctypes.Structure):
    _fields_ = [("saved_bytes", ctypes.c_uint64), ("forward_scratch_bytes", ctypes.c_uint64),
                ("backward_scratch_bytes", ctypes.c_uint64), ("h_floor_bytes", ctypes.c_uint64),
                ("index_bytes", ctypes.c_uint64)]


_FWD_TENSORS = ["x", "topk_ids", "topk_weights", "w_router", "router_bias", "w1", "w3", "w2", "y", "gates_out"]
_BWD_TENSORS = ["dy", "x", "topk_weights", "w_router", "router_bias", "w1", "w3", "w2",
                "dx", "dw1", "dw3", "dw2", "d_topk_weights", "dw_router"]


class ForwardArgs(ctypes.Structure):
    _fields_ = [(n, Tensor) for n in _FWD_TENSORS] + [
        ("mode", ctypes.c_int32), ("check_routing", ctypes.c_int32), ("saved", ctypes.c_uint64),
        ("saved_bytes", ctypes.c_uint64), ("scratch", ctypes.c_uint64), ("scratch_bytes", ctypes.c_uint64),
        ("bias_up", Tensor), ("bias_down", Tensor)]


class BackwardArgs(ctypes.Structure):
    _fields_ = [(n, Tensor) for n in _BWD_TENSORS] + [
        ("scratch", ctypes.c_uint64), ("scratch_bytes", ctypes.c_uint64), ("accumulate", ctypes.c_int32),
        ("bias_up", Tensor), ("bias_down", Tensor), ("d_bias_up", Tensor), ("d_bias_down", Tensor)]


class State(ctypes.Structure):
    _fields_ = [("layer", LayerConfig), ("tokens", ctypes.c_int64), ("mode", ctypes.c_int32),
                ("complete", ctypes.c_int32), ("layer_id", ctypes.c_uint64), ("saved", ctypes.c_uint64),
                ("saved_bytes", ctypes.c_uint64)] + [
        (n, ctypes.c_uint64) for n in ["expert_token_indices", "expert_token_offsets", "token_expert_indices",
                                        "token_index_map", "tile_prefix", "expert_counts", "status", "H"]]


# void (*)(const char* line, int32_t transient, void* user)
PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int32, ctypes.c_void_p)


def _candidates():
    here = Path(__file__).resolve().parent
    yield here / "libmoeblaze_c.so"
    checkout = here.parent.parent
    if os.environ.get("MOEBLAZE_BUILD_DIR"):
        yield checkout / os.environ["MOEBLAZE_BUILD_DIR"] / "lib" / "libmoeblaze_c.so"
    yield checkout / "build" / "lib" / "libmoeblaze_c.so"


def _open_library():
    """The shared library: the one $MOEBLAZE_LIBRARY names (and no other: a wrong setting must
    not quietly load a different build), else the package's, else a source checkout's."""
    env = os.environ.get("MOEBLAZE_LIBRARY")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ImportError(f"moeblaze: MOEBLAZE_LIBRARY={env}: no such file (unset it to use the package's "
                              "libmoeblaze_c.so)")
        try:
            return ctypes.CDLL(str(path)), path
        except OSError as e:
            raise ImportError(f"moeblaze: MOEBLAZE_LIBRARY={env}: cannot load it: {e}") from None
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file():
            return ctypes.CDLL(str(path)), path
    raise ImportError("moeblaze: libmoeblaze_c.so not found (looked at: " + ", ".join(tried) +
                      "); install the package with pip or set MOEBLAZE_LIBRARY")


def _load():
    lib, path = _open_library()
    c = ctypes
    P = c.POINTER
    sig = {
        "mb_version": ([], c.c_char_p), "mb_abi_version": ([], c.c_int),
        "mb_last_error": ([], c.c_char_p), "mb_last_error_argument": ([], c.c_char_p),
        "mb_gpu_available": ([], c.c_int),
        "mb_config_validate": ([P(LayerConfig)], c.c_int),
        "mb_config_describe": ([P(LayerConfig), c.c_char_p, c.c_size_t], c.c_int),
        "mb_plan_memory": ([P(LayerConfig), c.c_int64, c.c_int32, P(MemoryPlan)], c.c_int),
        "mb_validate_forward": ([P(LayerConfig), P(ForwardArgs)], c.c_int),
        "mb_validate_backward": ([P(LayerConfig), P(State), P(BackwardArgs)], c.c_int),
        "mb_layer_create": ([P(LayerConfig), c.c_int32, c.c_char_p, c.c_int64, P(c.c_void_p)], c.c_int),
        "mb_layer_destroy": ([c.c_void_p], None),
        "mb_layer_notices": ([c.c_void_p, c.c_char_p, c.c_size_t], c.c_int),
        "mb_layer_plan_memory": ([c.c_void_p, c.c_int64, c.c_int32, P(MemoryPlan)], c.c_int),
        "mb_layer_report": ([c.c_void_p, c.c_char_p, c.c_size_t], c.c_int),
        "mb_layer_forward": ([c.c_void_p, P(ForwardArgs), c.c_uint64, P(State)], c.c_int),
        "mb_layer_backward": ([c.c_void_p, P(State), P(BackwardArgs), c.c_uint64], c.c_int),
        "mb_token_bucket": ([c.c_int64, P(c.c_int64)], c.c_int),
        "mb_tune": ([P(LayerConfig), P(c.c_int64), c.c_int32, c.c_char_p, c.c_double, c.c_char_p, c.c_size_t],
                    c.c_int),
        "mb_set_progress_callback": ([PROGRESS_FN, c.c_void_p], c.c_int),
        "mb_presets": ([c.c_char_p, c.c_size_t], c.c_int),
        "mb_preset": ([c.c_char_p, P(LayerConfig), P(c.c_int64)], c.c_int),
        "mb_compile": ([P(LayerConfig), c.c_int64, c.c_char_p, c.c_char_p, c.c_char_p, c.c_size_t], c.c_int),
        "mb_toolchain": ([c.c_char_p, c.c_size_t], c.c_int),
        "mb_set_package_dirs": ([P(c.c_char_p), c.c_int32, c.c_char_p], c.c_int),
    }
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    if lib.mb_abi_version() != ABI_VERSION:
        raise ImportError(f"moeblaze: {path} has C ABI {lib.mb_abi_version()}, this package needs {ABI_VERSION}")
    from ._toolchain import register_packages
    register_packages(lib)  # where NVIDIA's packages are, before anything compiles
    return lib, path


lib, library_path = _load()


def _install_progress():
    """Routes the library's progress lines (a shape's first compile, tune's phases and counts)
    to the `moeblaze` logger (moeblaze._log)."""
    from ._log import ProgressLog
    log = ProgressLog()

    def on_progress(line, transient, _user):
        log(line.decode(errors="replace"), bool(transient))

    fn = PROGRESS_FN(on_progress)
    if lib.mb_set_progress_callback(fn, None) != OK:
        return None
    return fn  # kept alive: the library holds a pointer to it


_progress_callback = _install_progress()


def check(code: int) -> None:
    """Raises the Python exception for a C status code."""
    if code == OK:
        return
    msg = lib.mb_last_error().decode()
    if code == ERR_INVALID_ARGUMENT:
        raise InvalidArgument(lib.mb_last_error_argument().decode(), msg)
    if code == ERR_NO_GPU:
        raise NoGpu(code, msg)
    raise MoeblazeError(code, msg)


def make_config(experts: int, topk: int, hidden: int, ffn: int, activation: str = "swiglu",
                router: str | None = "softmax", renormalize: bool = False, route_scale: float = 1.0,
                weight_layout: str = "separate", expert_bias: bool = False) -> LayerConfig:
    """A layer's configuration, checked by the library (no GPU needed).

    experts (E, 1..512), topk (K, 1..16 and at most E), hidden (d) and ffn (n, multiples of 8 in
    8..65536) give the shape; activation is one of swiglu, geglu, clamped_swiglu (gated: W1 and
    W3) or silu, gelu, relu (W1 only); router is "softmax", "sigmoid" (DeepSeek-V3: sigmoid scores,
    picks by score + per-expert bias) or None (the caller passes topk_ids and topk_weights);
    renormalize renormalises the gates over the K picks; route_scale multiplies them;
    weight_layout "fused" takes one gate_up [E, 2n, d] in place of W1 and W3; expert_bias adds
    per-expert biases (GPT-OSS). Raises InvalidArgument naming the first bad argument.

    >>> cfg = make_config(64, 8, 2048, 1024)
    >>> describe(cfg)
    'E=64 K=8 d=2048 n=1024 swiglu router=softmax'
    """
    from ._validate import INT32_MAX, check_int, check_real
    experts, topk = check_int("experts", experts, 1, INT32_MAX), check_int("topk", topk, 1, INT32_MAX)
    hidden, ffn = check_int("hidden", hidden, 1, INT32_MAX), check_int("ffn", ffn, 1, INT32_MAX)
    route_scale = check_real("route_scale", route_scale, 0.0, 1e6, positive=True)
    if activation not in ACTIVATIONS:
        raise InvalidArgument("activation", f"activation: '{activation}' is not one of {sorted(ACTIVATIONS)}")
    if router not in ROUTERS:
        raise InvalidArgument("router", f"router: '{router}' is not one of softmax, sigmoid, None")
    if weight_layout not in WEIGHT_LAYOUTS:
        raise InvalidArgument("weight_layout", f"weight_layout: '{weight_layout}' is not one of separate, fused")
    cfg = LayerConfig(experts, topk, hidden, ffn, ACTIVATIONS[activation], ROUTERS[router], int(bool(renormalize)),
                      route_scale, WEIGHT_LAYOUTS[weight_layout], int(bool(expert_bias)))
    check(lib.mb_config_validate(ctypes.byref(cfg)))
    return cfg


def describe(cfg: LayerConfig) -> str:
    """The layer's one-line description, as the CLI and the cache name it (for example
    "E=64 K=8 d=2048 n=1024 swiglu router=softmax")."""
    buf = ctypes.create_string_buffer(512)
    check(lib.mb_config_describe(ctypes.byref(cfg), buf, len(buf)))
    return buf.value.decode()


def plan_memory(cfg: LayerConfig, tokens: int, mode: str = "save-h") -> MemoryPlan:
    """Bytes one forward + backward of `tokens` tokens needs beyond its inputs and outputs, per
    checkpoint mode (no GPU needed; `moeblaze plan` prints the same).

    mode: "save-h" keeps H = [A|B] between forward and backward, "recompute" only the index
    arrays. The fields: saved_bytes (held from forward to backward), forward_scratch_bytes,
    backward_scratch_bytes (freed after each pass), h_floor_bytes (the size of H alone) and
    index_bytes (the routing index arrays)."""
    from ._validate import INT64_MAX, check_int
    if mode not in MODES:
        raise InvalidArgument("checkpoint", f"checkpoint: '{mode}' is not one of save-h, recompute")
    tokens = check_int("tokens", tokens, 1, INT64_MAX)
    out = MemoryPlan()
    check(lib.mb_plan_memory(ctypes.byref(cfg), int(tokens), MODES[mode], ctypes.byref(out)))
    return out


def presets() -> list[str]:
    """The model presets' names (`moeblaze presets`), the benchmark suite first."""
    buf = ctypes.create_string_buffer(4096)
    check(lib.mb_presets(buf, len(buf)))
    return buf.value.decode().split()


def preset(name: str) -> tuple[LayerConfig, int]:
    """A preset's layer config and its token count; InvalidArgument listing the names if unknown."""
    cfg, tokens = LayerConfig(), ctypes.c_int64()
    check(lib.mb_preset(str(name).encode(), ctypes.byref(cfg), ctypes.byref(tokens)))
    return cfg, tokens.value


def compile_kernels(layer, tokens: int = 0, families=None, cache_path: str | None = None) -> dict:
    """Generates and NVRTC-compiles a layer's kernels, as `moeblaze generate` does; no GPU needed.

    layer: a preset name or a LayerConfig (make_config). tokens: the token count the default
    tiles are chosen for (0: the rule without one). families: kernel family names to compile
    (default: every family of the layer). cache_path: None for the default cache, "" for none;
    kernels in the cache are taken from it, compiled ones stored there. Returns the report: the
    layer, the NVRTC version, counts, and per kernel its family, name, tile, registers, spill
    bytes and compile time. Raises MoeblazeError (ERR_COMPILE) when a kernel does not compile."""
    from ._validate import INT64_MAX, check_int
    cfg = preset(layer)[0] if isinstance(layer, str) else layer
    tokens = check_int("tokens", tokens, 0, INT64_MAX)
    if isinstance(families, str):
        families = [families]
    names = ",".join(families).encode() if families else None
    path = None if cache_path is None else os.fsencode(cache_path)
    buf = ctypes.create_string_buffer(1 << 20)
    code = lib.mb_compile(ctypes.byref(cfg), int(tokens), names, path, buf, len(buf))
    report = buf.value.decode(errors="replace")
    check(code)
    return json.loads(report)


def token_bucket(tokens: int) -> int:
    """The power of two tuned tiles are keyed by (the library's own rule, mb_token_bucket)."""
    out = ctypes.c_int64()
    check(lib.mb_token_bucket(int(tokens), ctypes.byref(out)))
    return out.value


def tensor(ptr: int, dtype: str, shape) -> Tensor:
    shape = tuple(int(s) for s in shape)
    t = Tensor()
    t.ptr = int(ptr)
    t.dtype = DTYPES[dtype]
    t.ndim = len(shape)
    for i, s in enumerate(shape):
        t.shape[i] = s
    return t


def gpu_available() -> bool:
    """Whether a GPU the layer can run on is here (a driver and a device). False on a machine
    without one, where calls that run kernels raise NoGpu; nothing is started by asking."""
    return bool(lib.mb_gpu_available())
