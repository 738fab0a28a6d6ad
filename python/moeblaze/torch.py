"""moeblaze for PyTorch: the MoE layer as an autograd function over the C ABI.

- `moe(...)`: functional form (caller's routing or the built-in router).
- `MoE(...)`: nn.Module with weights in the Hugging Face layout (w1/w3 [E, n, d], w2 [E, d, n]).
- Both run as torch.library custom ops ("moeblaze::forward", "moeblaze::backward",
  "moeblaze::backward_accumulate"): opaque to torch.compile, on the current CUDA stream, with
  saved state and scratch allocated through torch (its memory accounting sees them; autograd
  frees them), and without host syncs, so a step can be captured in a CUDA graph.
- Caller routing (router=None) checks its ids: an id outside [0, E) (or a token that picks
  one expert twice) raises InvalidArgument('topk_ids'). That reads the layer's status word,
  one 4-byte device-to-host copy after the index build: a host sync per layer call.
  check_routing=False skips it (bad ids are then left out: they add nothing to y or dx, their
  gate gradient is 0); a forward captured into a CUDA graph skips it on its own. The built-in
  routers' ids are always in range and never sync.
- Weight gradients accumulate in the GEMM epilogues: when every expert weight already has a
  bf16 `.grad` (micro-batches), or a Megatron-style fp32 `main_grad`, the backward adds into it
  and hands autograd no gradient for that weight (no fresh gradient tensor, no add kernel).
"""
from __future__ import annotations

import ctypes
import warnings
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _capi as C
from ._routing import routing_check_active
from ._validate import INT32_MAX, INT64_MAX, TensorInfo, check_device, check_int, check_moe_args, check_real

_DTYPES = {torch.bfloat16: "bf16", torch.float32: "f32", torch.int32: "i32"}
_STATE_BYTES = ctypes.sizeof(C.State)


def _info(t: Optional[Tensor]) -> Optional[TensorInfo]:
    if t is None:
        return None
    return TensorInfo(_DTYPES.get(t.dtype, str(t.dtype).replace("torch.", "")), t.device.type,
                      t.device.index if t.device.index is not None else 0, tuple(t.shape), t.is_contiguous(),
                      t.data_ptr())


def _ref(t: Optional[Tensor]) -> C.Tensor:
    return C.Tensor() if t is None or t.numel() == 0 else C.tensor(t.data_ptr(), _DTYPES[t.dtype], t.shape)


def _config(cfg: Sequence[int], route_scale: float) -> C.LayerConfig:
    # cfg: experts, topk, hidden, ffn, activation, router, renormalize[, weight_layout, expert_bias[,
    # default_tiles]]
    extra = [int(v) for v in cfg[7:9]] + [0] * (9 - max(len(cfg), 7))
    return C.LayerConfig(*[int(v) for v in cfg[:7]], float(route_scale), *extra)


# One loaded layer per (config, device, token bucket): kernels come tuned from the cache.
_layers: dict = {}


_notices_shown: set = set()


def _show_notices(h) -> None:
    """Says once per process what a layer's creation noticed (an unusable or read-only cache, a
    tuned winner that was not a tile): the layer runs, but the user should know why it may be
    slower or compile every time."""
    buf = ctypes.create_string_buffer(1 << 14)
    if C.lib.mb_layer_notices(h, buf, len(buf)) != C.OK:
        return
    for line in buf.value.decode(errors="replace").splitlines():
        if line and line not in _notices_shown:
            _notices_shown.add(line)
            warnings.warn(f"moeblaze: {line}", RuntimeWarning, stacklevel=3)


def _layer(cfg: C.LayerConfig, device: int, tokens: int, default_tiles: bool = False):
    key = (tuple(getattr(cfg, f) for f, _ in C.LayerConfig._fields_), device, C.token_bucket(tokens), default_tiles)
    h = _layers.get(key)
    if h is None:
        h = ctypes.c_void_p()
        # default_tiles: no cache at all ("" = the default tiles, compiled here), so that the
        # tiles cannot depend on what was tuned (expert parallelism's bitwise reproducibility).
        cache = b"" if default_tiles else None
        C.check(C.lib.mb_layer_create(ctypes.byref(cfg), device, cache, tokens, ctypes.byref(h)))
        _layers[key] = h
        _show_notices(h)
    return h


def _default_tiles(cfg: Sequence[int]) -> bool:
    """cfg's optional 10th entry (after weight_layout and expert_bias): 1 runs the default
    tiles (see _layer)."""
    return len(cfg) > 9 and bool(cfg[9])


def _release_layers() -> None:
    """Destroys every loaded layer (their kernels are reloaded on next use). Work already queued
    on the GPU may still run their kernels, so the device is synchronised first."""
    if _layers and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    while _layers:
        _, h = _layers.popitem()
        C.lib.mb_layer_destroy(h)


def layer_report(cfg: Sequence[int], route_scale: float, device: int, tokens: int) -> str:
    """Which kernels (tuned or default, cached or compiled) a shape runs with."""
    c = _config(cfg, route_scale)
    buf = ctypes.create_string_buffer(4096)
    C.check(C.lib.mb_layer_report(_layer(c, device, tokens), buf, len(buf)))
    return buf.value.decode()


def _empty(dtype=torch.float32, device="cuda") -> Tensor:
    return torch.empty(0, dtype=dtype, device=device)


@torch.library.custom_op("moeblaze::forward", mutates_args=(), device_types="cuda")
def _forward(x: Tensor, topk_ids: Optional[Tensor], topk_weights: Optional[Tensor], w_router: Optional[Tensor],
             router_bias: Optional[Tensor], w1: Tensor, w3: Optional[Tensor], w2: Tensor, bias_up: Optional[Tensor],
             bias_down: Optional[Tensor], cfg: List[int], route_scale: float,
             mode: int, check_routing: bool = False) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns y [T,d], saved state (uint8), the forward state (uint8, host), tokens per
    expert (int32 [E]) and the built-in router's gates (f32 [T,K], empty otherwise).
    check_routing (caller routing): raise InvalidArgument('topk_ids') for ids outside [0, E)
    or a repeated expert, a host sync after the index build; skipped while the stream is
    being captured into a CUDA graph."""
    c = _config(cfg, route_scale)
    T = check_moe_args(c, _info(x), _info(topk_ids), _info(topk_weights), _info(w_router), _info(router_bias),
                       _info(w1), _info(w3), _info(w2), _info(bias_up), _info(bias_down))
    dev = x.device.index if x.device.index is not None else 0
    h = _layer(c, dev, T, _default_tiles(cfg))
    plan = C.MemoryPlan()
    C.check(C.lib.mb_layer_plan_memory(h, T, mode, ctypes.byref(plan)))
    saved = torch.empty(plan.saved_bytes, dtype=torch.uint8, device=x.device)
    scratch = torch.empty(plan.forward_scratch_bytes, dtype=torch.uint8, device=x.device)
    y = torch.empty_like(x)
    gates = torch.empty(T, c.topk, dtype=torch.float32, device=x.device) if c.router else _empty(device=x.device)
    a = C.ForwardArgs()
    for name, t in (("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights), ("w_router", w_router),
                    ("router_bias", router_bias), ("w1", w1), ("w3", w3), ("w2", w2), ("y", y),
                    ("bias_up", bias_up), ("bias_down", bias_down)):
        setattr(a, name, _ref(t))
    if c.router:
        a.gates_out = _ref(gates)
    a.mode = mode
    a.check_routing = int(c.router == 0 and routing_check_active(check_routing))
    a.saved, a.saved_bytes = saved.data_ptr(), plan.saved_bytes
    a.scratch, a.scratch_bytes = scratch.data_ptr(), plan.forward_scratch_bytes
    st = C.State()
    stream = torch.cuda.current_stream(x.device).cuda_stream
    code = C.lib.mb_layer_forward(h, ctypes.byref(a), stream, ctypes.byref(st))
    if code == C.ERR_INVALID_ARGUMENT and a.check_routing and C.lib.mb_last_error_argument() == b"topk_ids":
        raise C.InvalidArgument("topk_ids", C.lib.mb_last_error().decode() +
                                " (check_routing=False leaves such picks out instead)")
    C.check(code)
    state = torch.empty(_STATE_BYTES, dtype=torch.uint8)
    ctypes.memmove(state.data_ptr(), ctypes.addressof(st), _STATE_BYTES)
    off = st.expert_counts - saved.data_ptr()
    counts = saved[off:off + 4 * c.experts].view(torch.int32).clone()
    return y, saved, state, counts, gates


@_forward.register_fake
def _(x, topk_ids, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, cfg, route_scale, mode,
      check_routing=False):
    T = x.shape[0]
    plan = C.plan_memory(_config(cfg, route_scale), T, "save-h" if mode == 0 else "recompute")
    gates = x.new_empty((T, cfg[1]), dtype=torch.float32) if cfg[5] else x.new_empty((0,), dtype=torch.float32)
    return (torch.empty_like(x), x.new_empty((plan.saved_bytes,), dtype=torch.uint8),
            torch.empty(_STATE_BYTES, dtype=torch.uint8), x.new_empty((cfg[0],), dtype=torch.int32), gates)


def _launch_backward(dy, x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, saved, state, cfg,
                     route_scale, dw1, dw3, dw2, dbu, dbd, accumulate: bool):
    """The C ABI backward into the given weight and bias gradients (added to when `accumulate`
    or fp32); returns dx, d_topk_weights (empty with the built-in router), dw_router (empty
    without)."""
    c = _config(cfg, route_scale)
    st = C.State()
    ctypes.memmove(ctypes.addressof(st), state.data_ptr(), _STATE_BYTES)
    T = int(st.tokens)
    if tuple(dy.shape) != (T, c.hidden):
        raise C.InvalidArgument("dy", f"dy: has shape {list(dy.shape)}, expected {[T, c.hidden]}")
    dev = x.device.index if x.device.index is not None else 0
    h = _layer(c, dev, T, _default_tiles(cfg))
    plan = C.MemoryPlan()
    C.check(C.lib.mb_layer_plan_memory(h, T, st.mode, ctypes.byref(plan)))
    scratch = torch.empty(plan.backward_scratch_bytes, dtype=torch.uint8, device=x.device)
    dx = torch.empty_like(x)
    dtw = torch.empty(T, c.topk, dtype=torch.float32, device=x.device) if not c.router else _empty(device=x.device)
    dwr = torch.empty_like(w_router) if w_router is not None else _empty(torch.bfloat16, x.device)
    b = C.BackwardArgs()
    for name, t in (("dy", dy), ("x", x), ("topk_weights", topk_weights), ("w_router", w_router),
                    ("router_bias", router_bias), ("w1", w1), ("w3", w3), ("w2", w2), ("dx", dx), ("dw1", dw1),
                    ("dw3", dw3), ("dw2", dw2), ("d_topk_weights", dtw), ("dw_router", dwr), ("bias_up", bias_up),
                    ("bias_down", bias_down), ("d_bias_up", dbu), ("d_bias_down", dbd)):
        setattr(b, name, _ref(t))
    b.scratch, b.scratch_bytes = scratch.data_ptr(), plan.backward_scratch_bytes
    b.accumulate = int(bool(accumulate))
    stream = torch.cuda.current_stream(x.device).cuda_stream
    C.check(C.lib.mb_layer_backward(h, ctypes.byref(st), ctypes.byref(b), stream))
    return dx, dtw, dwr


@torch.library.custom_op("moeblaze::backward", mutates_args=(), device_types="cuda")
def _backward(dy: Tensor, x: Tensor, topk_weights: Optional[Tensor], w_router: Optional[Tensor],
              router_bias: Optional[Tensor], w1: Tensor, w3: Optional[Tensor], w2: Tensor, bias_up: Optional[Tensor],
              bias_down: Optional[Tensor], saved: Tensor, state: Tensor, cfg: List[int],
              route_scale: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns dx, dw1, dw3 (empty if plain or fused), dw2, d_topk_weights (empty with the
    built-in router), dw_router (empty without it), d_bias_up, d_bias_down (empty without
    expert biases)."""
    # Each absent gradient is a tensor of its own: a custom op's outputs may not alias each other.
    def like(t: Optional[Tensor]) -> Tensor:
        return torch.empty_like(t) if t is not None else _empty(torch.bfloat16, x.device)
    dw1 = torch.empty_like(w1)
    dw3 = like(w3)
    dw2 = torch.empty_like(w2)
    dbu = like(bias_up)
    dbd = like(bias_down)
    dx, dtw, dwr = _launch_backward(dy, x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down,
                                    saved, state, cfg, route_scale, dw1, dw3, dw2, dbu, dbd, False)
    return dx, dw1, dw3, dw2, dtw, dwr, dbu, dbd


@_backward.register_fake
def _(dy, x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, saved, state, cfg, route_scale):
    def like(t):
        return torch.empty_like(t) if t is not None else x.new_empty((0,))
    return (torch.empty_like(x), torch.empty_like(w1), like(w3), torch.empty_like(w2),
            x.new_empty((x.shape[0], cfg[1]), dtype=torch.float32) if not cfg[5] else x.new_empty((0,), dtype=torch.float32),
            like(w_router), like(bias_up), like(bias_down))


@torch.library.custom_op("moeblaze::backward_accumulate", mutates_args=("dw1", "dw3", "dw2", "dbu", "dbd"),
                         device_types="cuda")
def _backward_accumulate(dy: Tensor, x: Tensor, topk_weights: Optional[Tensor], w_router: Optional[Tensor],
                         router_bias: Optional[Tensor], w1: Tensor, w3: Optional[Tensor], w2: Tensor,
                         bias_up: Optional[Tensor], bias_down: Optional[Tensor], saved: Tensor, state: Tensor,
                         cfg: List[int], route_scale: float, dw1: Tensor, dw3: Optional[Tensor], dw2: Tensor,
                         dbu: Optional[Tensor], dbd: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward with the weight (and bias) gradients added into dw1/dw3/dw2/dbu/dbd (all
    bf16, or all fp32) by the epilogues. Returns dx, d_topk_weights, dw_router as _backward."""
    return _launch_backward(dy, x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, saved, state,
                            cfg, route_scale, dw1, dw3, dw2, dbu, dbd, True)


@_backward_accumulate.register_fake
def _(dy, x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, saved, state, cfg, route_scale,
      dw1, dw3, dw2, dbu, dbd):
    empty_f = x.new_empty((0,), dtype=torch.float32)
    return (torch.empty_like(x), x.new_empty((x.shape[0], cfg[1]), dtype=torch.float32) if not cfg[5] else empty_f,
            torch.empty_like(w_router) if w_router is not None else x.new_empty((0,)))


_W1, _BIAS_UP = 5, 8  # positions of w1 and bias_up among the forward op's inputs


def _setup_context(ctx, inputs, output):
    x, topk_ids, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, cfg, route_scale, mode = \
        inputs[:13]  # then check_routing, which backward does not need
    _, saved, state, _, _ = output
    ctx.save_for_backward(x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, saved, state)
    ctx.cfg, ctx.route_scale, ctx.mode = cfg, route_scale, mode
    # By default autograd hands backward a zero tensor for every output without a gradient,
    # here the whole saved buffer (1.8 GiB on mixtral-8x7b) in the middle of the step.
    ctx.set_materialize_grads(False)


_fused_accumulation = True


def set_fused_accumulation(enabled: bool) -> None:
    """Whether the backward adds into existing .grad / main_grad in its epilogues (default on).
    Off: it always returns fresh gradients and autograd accumulates them (allocating a
    gradient-sized tensor and running an add per weight); for comparison, or for hooks that
    expect to see every gradient (tensor hooks registered with register_hook)."""
    global _fused_accumulation
    _fused_accumulation = bool(enabled)


def _accumulation_target(w: Tensor) -> Optional[Tensor]:
    """Where w's gradient can be added in place: its fp32 `main_grad` (Megatron's convention),
    else its bf16 `.grad`; None when neither fits. Only for a plain leaf weight seen eagerly:
    under torch.compile the backward is traced with functional tensors, and a DTensor (FSDP2's
    sharded parameter) has its gradient reduced by FSDP, so both take the store path."""
    if type(w) not in (torch.Tensor, torch.nn.Parameter) or not w.is_leaf:
        return None
    main = getattr(w, "main_grad", None)
    if isinstance(main, torch.Tensor):
        ok = main.dtype == torch.float32 and main.shape == w.shape and main.is_contiguous() and main.device == w.device
        return main if ok else None
    g = w.grad
    if g is None or g.dtype != torch.bfloat16 or g.shape != w.shape or not g.is_contiguous() or g.requires_grad:
        return None
    return g


def _accumulation_targets(weights: Sequence[Optional[Tensor]]) -> Optional[List[Optional[Tensor]]]:
    """The tensors to add the gradients of `weights` (w1, w3, w2, bias_up, bias_down; None where
    absent) into, when every weight has a target of one kind (all fp32 main_grad, or all bf16
    .grad); else None (the backward returns fresh gradients to autograd)."""
    if not _fused_accumulation or torch.is_grad_enabled():  # create_graph=True: gradients are graph outputs
        return None
    present = [w for w in weights if w is not None]
    targets = [_accumulation_target(w) for w in present]
    if any(t is None for t in targets) or len({t.dtype for t in targets}) != 1:
        return None
    if targets[0].dtype == torch.float32:
        for w in present:
            if hasattr(w, "grad_added_to_main_grad"):
                w.grad_added_to_main_grad = True
    it = iter(targets)
    return [next(it) if w is not None else None for w in weights]


def _autograd_backward(ctx, dy, _dsaved, _dstate, _dcounts, _dgates):
    if dy is None:  # y did not reach the loss: no gradient flows through the layer
        return (None,) * 14
    # In save-h mode the backward writes dH over the saved H (peak memory): one backward per forward.
    if ctx.mode == 0 and getattr(ctx, "consumed", False):
        raise RuntimeError("moeblaze: this forward's saved activations were consumed by an earlier backward "
                           "(dH is written over them); run the forward again instead of retain_graph=True")
    ctx.consumed = True
    x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, saved, state = ctx.saved_tensors
    args = (dy.contiguous(), x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, saved, state,
            ctx.cfg, ctx.route_scale)
    targets = _accumulation_targets((w1, w3, w2, bias_up, bias_down)) if ctx.needs_input_grad[_W1] else None
    if targets is not None:
        dx, dtw, dwr = torch.ops.moeblaze.backward_accumulate(*args, *targets)
        # Already added into .grad / main_grad. A weight Megatron tracks (grad_added_to_main_grad)
        # gets Transformer Engine's dummy gradient instead of None, so that its DDP hook fires
        # (under overlap_grad_reduce it asserts on a None gradient) and skips the add.
        from .megatron import dummy_wgrad_for

        dw1, dw3, dw2, dbu, dbd = (dummy_wgrad_for(w, t) for w, t in zip((w1, w3, w2, bias_up, bias_down), targets))
    else:
        dx, dw1, dw3, dw2, dtw, dwr, dbu, dbd = _backward(*args)
    present = lambda t, g: g if t is not None else None  # noqa: E731
    return (dx, None, present(topk_weights, dtw), present(w_router, dwr), None, dw1, present(w3, dw3), dw2,
            present(bias_up, dbu), present(bias_down, dbd), None, None, None, None)


torch.library.register_autograd("moeblaze::forward", _autograd_backward, setup_context=_setup_context)


class MoEOutput(NamedTuple):
    y: Tensor              # [T, d] (or the input's leading shape)
    expert_counts: Tensor  # int32 [E]: tokens routed to each expert (for load-balancing losses)
    gates: Tensor          # f32 [T, K]: the built-in router's gates (empty with caller routing)


def _cfg_list(experts, topk, hidden, ffn, activation, router, renormalize, weight_layout="separate",
              expert_bias=False, names=("experts", "topk", "hidden", "ffn")) -> List[int]:
    """The config as the custom ops take it; each count checked to fit a C int (ctypes would
    otherwise cut 2**32 + 8 to 8) under the caller's name for it."""
    if activation not in C.ACTIVATIONS:
        raise C.InvalidArgument("activation", f"activation: '{activation}' is not one of {sorted(C.ACTIVATIONS)}")
    if router not in C.ROUTERS:
        raise C.InvalidArgument("router", f"router: '{router}' is not one of softmax, sigmoid, None")
    if weight_layout not in C.WEIGHT_LAYOUTS:
        raise C.InvalidArgument("weight_layout", f"weight_layout: '{weight_layout}' is not one of separate, fused")
    counts = [check_int(name, v, 1, INT32_MAX) for name, v in zip(names, (experts, topk, hidden, ffn))]
    return counts + [C.ACTIVATIONS[activation], C.ROUTERS[router], int(bool(renormalize)),
                     C.WEIGHT_LAYOUTS[weight_layout], int(bool(expert_bias))]


def _check_devices(**tensors) -> None:
    """Every given tensor on a CUDA device, checked before dispatch (the ops are registered for
    CUDA only, and torch would answer with NotImplementedError)."""
    for name, t in tensors.items():
        if t is not None:
            check_device(name, t.device.type)


def moe(x: Tensor, w1: Tensor, w3: Optional[Tensor], w2: Tensor, *, topk_ids: Optional[Tensor] = None,
        topk_weights: Optional[Tensor] = None, w_router: Optional[Tensor] = None, router: Optional[str] = None,
        top_k: Optional[int] = None, router_bias: Optional[Tensor] = None, renormalize: bool = False,
        route_scale: float = 1.0, activation: str = "swiglu", checkpoint: str = "save-h",
        bias_up: Optional[Tensor] = None, bias_down: Optional[Tensor] = None,
        check_routing: bool = True) -> MoEOutput:
    """The MoE layer. Caller routing: topk_ids [T,K] int32 and topk_weights [T,K] float32 (the
    gate gradient flows back to them, so the caller's router trains). Built-in router: w_router
    [E,d], router="softmax" or "sigmoid" and top_k. x [T,d] bf16, w1/w3 [E,n,d], w2 [E,d,n] bf16.
    With a gated activation and w3=None, w1 is the fused gate_up [E,2n,d] (each expert's W1 rows,
    then its W3 rows: Hugging Face's gate_up_proj), read in place; its gradient has its layout.
    Expert biases (GPT-OSS; both or neither): bias_up [E, G*n] ([gate | up] per expert, added to
    A and B), bias_down [E, d] (added to each expert's output before the gate).

    check_routing (caller routing): an id outside [0, E), or a token picking one expert twice,
    raises InvalidArgument('topk_ids'). The check reads the layer's status word after the
    index build, a host sync (one 4-byte copy) per call that keeps the CPU from queueing work
    ahead of the GPU; False skips it, and bad ids are then left out (no output, no gradient,
    d_topk_weights 0 for them). Skipped while a CUDA graph is being captured."""
    if checkpoint not in C.MODES:
        raise C.InvalidArgument("checkpoint", f"checkpoint: '{checkpoint}' is not one of save-h, recompute")
    _check_devices(x=x, w1=w1, w3=w3, w2=w2, topk_ids=topk_ids, topk_weights=topk_weights, w_router=w_router,
                   router_bias=router_bias, bias_up=bias_up, bias_down=bias_down)
    route_scale = check_real("route_scale", route_scale, 0.0, 1e6, positive=True)
    if w1.dim() != 3:
        raise C.InvalidArgument("w1", f"w1: must be [E, n, d], got shape {list(w1.shape)}")
    if w2.dim() != 3:
        raise C.InvalidArgument("w2", f"w2: must be [E, d, n], got shape {list(w2.shape)}")
    E, n, d = w2.shape[0], w2.shape[2], w2.shape[1]
    fused = w3 is None and activation in C.GATED
    if tuple(w1.shape) != (E, 2 * n if fused else n, d):
        want = "[E, 2n, d] (a fused gate_up: w3 is None)" if fused else "[E, n, d]"
        raise C.InvalidArgument("w1", f"w1: must be {want} = {[E, 2 * n if fused else n, d]} for w2 of shape "
                                      f"{list(w2.shape)}, got {list(w1.shape)}")
    if w_router is not None and router is None:
        router = "softmax"
    if topk_ids is not None:
        if topk_ids.dim() != 2:
            raise C.InvalidArgument("topk_ids", f"topk_ids: must be [T, K], got shape {list(topk_ids.shape)}")
        K = topk_ids.shape[1]
    elif top_k is not None:
        K = check_int("top_k", top_k, 1, INT32_MAX)
    else:
        raise C.InvalidArgument("topk_ids", "topk_ids: pass the caller's picks, or top_k with the built-in router")
    if (bias_up is None) != (bias_down is None):
        missing = "bias_down" if bias_down is None else "bias_up"
        raise C.InvalidArgument(missing, f"{missing}: expert biases come in pairs (bias_up and bias_down)")
    cfg = _cfg_list(E, K, d, n, activation, router, renormalize, "fused" if fused else "separate",
                    bias_up is not None)
    y, _, _, counts, gates = torch.ops.moeblaze.forward(x, topk_ids, topk_weights, w_router, router_bias, w1, w3,
                                                        w2, bias_up, bias_down, cfg, float(route_scale),
                                                        C.MODES[checkpoint], bool(check_routing))
    return MoEOutput(y, counts, gates)


class MoE(torch.nn.Module):
    """MoE layer with weights in the Hugging Face layout: w1 (gate_proj) and w3 (up_proj)
    [E, n, d], w2 (down_proj) [E, d, n], router `gate.weight` [E, d]. Input [..., d] bf16.
    With router=None, forward takes topk_ids and topk_weights."""

    def __init__(self, num_experts: int, top_k: int, hidden: int, ffn: int, activation: str = "swiglu",
                 router: Optional[str] = "softmax", checkpoint: str = "save-h", renormalize: bool = False,
                 route_scale: float = 1.0, device=None, dtype=torch.bfloat16):
        super().__init__()
        if dtype != torch.bfloat16:
            raise C.InvalidArgument("dtype", "dtype: moeblaze runs bf16 weights")
        if checkpoint not in C.MODES:
            raise C.InvalidArgument("checkpoint", f"checkpoint: '{checkpoint}' is not one of save-h, recompute")
        self.cfg = _cfg_list(num_experts, top_k, hidden, ffn, activation, router, renormalize,
                             names=("num_experts", "top_k", "hidden", "ffn"))
        route_scale = check_real("route_scale", route_scale, 0.0, 1e6, positive=True)
        try:  # the library's own checks (ranges, K <= E, multiples of 8), named as this signature names them
            C.make_config(num_experts, top_k, hidden, ffn, activation, router, renormalize, route_scale)
        except C.InvalidArgument as e:
            name = {"experts": "num_experts", "topk": "top_k"}.get(e.argument, e.argument)
            raise C.InvalidArgument(name, str(e).replace(f"{e.argument}:", f"{name}:", 1)) from None
        self.route_scale, self.checkpoint, self.activation, self.router = float(route_scale), checkpoint, activation, router
        kw = dict(device=device, dtype=dtype)
        self.w1 = torch.nn.Parameter(torch.empty(num_experts, ffn, hidden, **kw))
        self.w3 = torch.nn.Parameter(torch.empty(num_experts, ffn, hidden, **kw)) if activation in C.GATED else None
        self.w2 = torch.nn.Parameter(torch.empty(num_experts, hidden, ffn, **kw))
        self.gate = torch.nn.Linear(hidden, num_experts, bias=False, **kw) if router else None
        if router == "sigmoid":
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, device=device, dtype=torch.float32))
        else:
            self.e_score_correction_bias = None
        self.tokens_seen: set = set()
        self.reset_parameters()

    def reset_parameters(self):
        d, n = self.cfg[2], self.cfg[3]
        with torch.no_grad():
            for w, fan_in in ((self.w1, d), (self.w3, d), (self.w2, n)):
                if w is not None:
                    w.uniform_(-(3.0 / fan_in) ** 0.5, (3.0 / fan_in) ** 0.5)
            if self.gate is not None:
                self.gate.weight.uniform_(-(3.0 / d) ** 0.5, (3.0 / d) ** 0.5)

    def forward(self, hidden_states: Tensor, topk_ids: Optional[Tensor] = None,
                topk_weights: Optional[Tensor] = None, check_routing: bool = True) -> MoEOutput:
        """check_routing: with router=None, as moeblaze.torch.moe's (a host sync per call; the
        built-in router's ids need no check)."""
        # "x" is what the op and every message call the input.
        _check_devices(x=hidden_states, w1=self.w1, w3=self.w3, w2=self.w2, topk_ids=topk_ids,
                       topk_weights=topk_weights, w_router=self.gate.weight if self.gate is not None else None)
        lead = hidden_states.shape[:-1]
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        self.tokens_seen.add(int(x.shape[0]))
        if self.router is None and (topk_ids is None or topk_weights is None):
            raise C.InvalidArgument("topk_ids", "topk_ids: a layer without router needs topk_ids and topk_weights")
        y, _, _, counts, gates = torch.ops.moeblaze.forward(
            x, topk_ids, topk_weights, self.gate.weight if self.gate is not None else None, self.e_score_correction_bias,
            self.w1, self.w3, self.w2, None, None, self.cfg, self.route_scale, C.MODES[self.checkpoint],
            bool(check_routing))
        return MoEOutput(y.reshape(*lead, y.shape[-1]), counts, gates)

    def extra_repr(self) -> str:
        E, K, d, n = self.cfg[:4]
        return f"experts={E}, top_k={K}, hidden={d}, ffn={n}, activation={self.activation}, router={self.router}, checkpoint={self.checkpoint}"


def split_gate_up(gate_up: Tensor, layout: str = "E,2n,d", interleaved: bool = False) -> Tuple[Tensor, Tensor]:
    """Fused gate_up weights to (w1, w3), each [E, n, d] contiguous.
    layout "E,2n,d": gate_up[e] = [gate; up] along rows (Qwen3-MoE, Mixtral-style fused).
    layout "E,d,2n": gate_up[e] is [d, 2n] (GPT-OSS); interleaved=True when gate and up alternate
    columns (gate = [..., ::2], up = [..., 1::2])."""
    if gate_up.dim() != 3:
        raise C.InvalidArgument("gate_up", f"gate_up: must be 3-D, got shape {list(gate_up.shape)}")
    if layout == "E,d,2n":
        gate_up = gate_up.transpose(1, 2)  # [E, 2n, d]
    elif layout != "E,2n,d":
        raise C.InvalidArgument("layout", "layout: 'E,2n,d' or 'E,d,2n'")
    if gate_up.shape[1] % 2:
        raise C.InvalidArgument("gate_up", "gate_up: the fused dimension must be even")
    if interleaved:
        w1, w3 = gate_up[:, 0::2], gate_up[:, 1::2]
    else:
        n = gate_up.shape[1] // 2
        w1, w3 = gate_up[:, :n], gate_up[:, n:]
    return w1.contiguous(), w3.contiguous()


def stack_experts(weights: Sequence[Tensor]) -> Tensor:
    """Per-expert nn.Linear weights ([n, d] each for gate/up, [d, n] for down) to one [E, ., .] tensor."""
    return torch.stack([w.detach() for w in weights]).contiguous()


def tune(model: torch.nn.Module, tokens: Optional[Sequence[int]] = None, cache_path: Optional[str] = None,
         budget_s: float = 300.0) -> List[dict]:
    """Tunes every distinct MoE shape in `model` into the kernel cache that the CLI and training
    processes share, and returns one report (a dict) per shape.

    tokens: token counts per step to tune for (default: the counts the layers have seen; each is
    bucketed to a power of two). cache_path: the cache file (default: $MOEBLAZE_CACHE, else
    ~/.cache/moeblaze/kernels.db). budget_s: seconds of timing after which the remaining kernel
    families keep their default tiles.

    Every candidate tile is compiled into the cache (about two minutes a shape on a few cores),
    then, on a GPU, timed against the default tiles; the winners are stored and loaded by the
    next forward. Progress goes to the `moeblaze` logger (INFO; MOEBLAZE_LOG_LEVEL). Without a
    GPU nothing is timed: the report says `"timed": False` with the reason, and a warning says
    so. Raises MoeblazeError when candidates failed to compile or to be stored."""
    import json
    from ._log import logger
    budget_s = check_real("budget_s", budget_s, 0.0, 30 * 24 * 3600.0, positive=True)
    if tokens is not None:
        tokens = [check_int("tokens", t, 1, INT64_MAX) for t in tokens]
    seen = {}
    for m in model.modules():
        if isinstance(m, MoE):
            key = (tuple(m.cfg), m.route_scale)
            seen.setdefault(key, set()).update(tokens or m.tokens_seen)
    if not seen:
        raise C.InvalidArgument("model", "model: has no moeblaze.torch.MoE layer")
    reports = []
    try:
        for i, ((cfg, scale), toks) in enumerate(seen.items()):
            if not toks:
                raise C.InvalidArgument("tokens", "tokens: run the model once or pass tokens=[...]")
            arr = (ctypes.c_int64 * len(toks))(*sorted(toks))
            buf = ctypes.create_string_buffer(1 << 16)
            c = _config(cfg, scale)
            logger.info("tune: shape %d of %d, %s, T = %s", i + 1, len(seen), C.describe(c),
                        ", ".join(str(t) for t in sorted(toks)))
            C.check(C.lib.mb_tune(ctypes.byref(c), arr, len(toks), cache_path.encode() if cache_path else None,
                                  budget_s, buf, len(buf)))
            report = json.loads(buf.value.decode())
            reports.append(report)
            if report.get("timed"):
                logger.info("tune: %s: step %.3f ms with the default tiles, %.3f ms tuned", report.get("layer"),
                            report.get("step_default_ms", 0.0), report.get("step_tuned_ms", 0.0))
            else:
                logger.warning("tune: nothing was timed for %s: %s. Every candidate is compiled into the cache "
                               "(%s), but no tile was picked: run moeblaze.tune on a GPU machine with this cache "
                               "to time them", report.get("layer"), report.get("why_not_timed") or "no reason given",
                               report.get("db"))
    finally:
        # The loaded layers hold the kernels from before tuning: destroyed (not only forgotten,
        # which leaked their modules), so the next use loads the tuned ones.
        _release_layers()
    return reports
