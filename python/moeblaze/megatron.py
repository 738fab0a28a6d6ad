"""The moeblaze layer with Megatron-Core's gradient-accumulation fusion, as Transformer Engine
implements it (`fuse_wgrad_accumulation` in transformer_engine/pytorch/module/linear.py and
grouped_linear.py; Megatron's `--gradient-accumulation-fusion`).

    import moeblaze.megatron as mbm
    y = mbm.moe(x, w1, w3, w2, topk_ids=ids, topk_weights=probs, gradient_accumulation_fusion=True)

The contract, from megatron/core/distributed/distributed_data_parallel.py (megatron-core
0.16): DistributedDataParallel gives every parameter an fp32 `main_grad` (a view into its
contiguous gradient buffer), sets `param.grad_added_to_main_grad = False` (again in each
`zero_grad_buffer()`), and registers a hook on each parameter's gradient accumulator
(`_make_backward_post_hook`) that adds `param.grad` into `main_grad` unless
`grad_added_to_main_grad` is set (or `zero_out_wgrad` is), sets `param.grad = None` and, with
`overlap_grad_reduce`, marks the parameter ready for its bucket's reduction; there it also
asserts that `param.grad` is not None.

With gradient_accumulation_fusion=True the weight-gradient GEMMs add into `main_grad` in their
epilogues (captured at forward, as Transformer Engine does), set `grad_added_to_main_grad =
True` and return a dummy gradient: an uninitialised tensor of the weight's shape and dtype,
cached per (shape, dtype, device) (`get_dummy_wgrad`), zeros when the parameter has
`zero_out_wgrad`. The dummy makes autograd run the accumulator, so DDP's hook fires after the
gradient is in `main_grad`, skips the add and drops the dummy. A weight without the attribute
(no Megatron DDP) gets None, as in Transformer Engine.

With gradient_accumulation_fusion=False the backward returns fresh gradients in the weights'
dtype and never writes `main_grad` (DDP's hook adds them). moeblaze.torch.moe instead adds into
any fp32 `main_grad` it finds and returns None, which Megatron's hook refuses under
overlap_grad_reduce ("param.grad being None is not safe"): use this module with Megatron.

Routing comes from the caller as in moeblaze.torch.moe (`topk_ids` [T, K], `topk_weights`
[T, K], whose gradient flows back); `topk_from_routing_map` turns Megatron's router outputs
(dense probs and a boolean routing map, [T, E]) into that form.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from . import _capi as C
from . import torch as mbt

__all__ = ["get_dummy_wgrad", "moe", "topk_from_routing_map"]

# The kernels, through one name: the CPU tests put a reference implementation of the three ops here.
_ops = torch.ops.moeblaze

_dummy_wgrads: Dict[Tuple, Tensor] = {}


def get_dummy_wgrad(shape, dtype: torch.dtype, device, zero: bool = False) -> Tensor:
    """Transformer Engine's placeholder weight gradient: one uninitialised tensor per (shape,
    dtype, device), reused, filled with zeros on request. Returned detached, so that autograd's
    accumulator can take it as param.grad without a copy."""
    key = (tuple(shape), dtype, torch.device(device))
    t = _dummy_wgrads.get(key)
    if t is None:
        t = _dummy_wgrads[key] = torch.empty(shape, dtype=dtype, device=device)
    if zero:
        t.zero_()
    return t.detach()


def _main_grad(name: str, w: Tensor) -> Tensor:
    main = getattr(w, "main_grad", None)
    if not isinstance(main, torch.Tensor):
        raise C.InvalidArgument(name, f"{name}: gradient_accumulation_fusion needs an fp32 main_grad on every expert "
                                      "weight (Megatron's DistributedDataParallel allocates it); this one has none")
    if main.dtype != torch.float32 or main.shape != w.shape or not main.is_contiguous() or main.device != w.device:
        raise C.InvalidArgument(name, f"{name}: main_grad must be a contiguous float32 tensor of the weight's shape "
                                      f"{list(w.shape)} on {w.device}; it is {main.dtype} {list(main.shape)} on "
                                      f"{main.device}")
    return main


def dummy_wgrad_for(w: Optional[Tensor], target: Optional[Tensor]) -> Optional[Tensor]:
    """What the fused backward returns for a weight whose gradient it added into `target`: the
    dummy wgrad when target is the weight's fp32 main_grad and Megatron tracks the weight
    (grad_added_to_main_grad), else None (a bf16 .grad was added in place)."""
    if w is None or target is None or target.dtype != torch.float32 or not hasattr(w, "grad_added_to_main_grad"):
        return None
    return _dummy_for(w)


def _dummy_for(w: Tensor) -> Optional[Tensor]:
    if not hasattr(w, "grad_added_to_main_grad"):
        return None
    w.grad_added_to_main_grad = True
    return get_dummy_wgrad(w.shape, w.dtype, w.device, zero=getattr(w, "zero_out_wgrad", False))


_WEIGHTS = ("w1", "w3", "w2", "bias_up", "bias_down")


class _FusedAccumulationMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_weights, w1, w3, w2, bias_up, bias_down, topk_ids, cfg, mode, fusion):
        y, saved, state, counts, _ = _ops.forward(x, topk_ids, topk_weights, None, None, w1, w3, w2, bias_up,
                                                  bias_down, cfg, 1.0, mode)
        weights = (w1, w3, w2, bias_up, bias_down)
        ctx.main_grads = [_main_grad(n, w) if w is not None else None for n, w in zip(_WEIGHTS, weights)] \
            if fusion else None
        ctx.weights = weights  # the parameters themselves: their attributes are read in backward
        ctx.save_for_backward(x, topk_weights, saved, state)
        ctx.cfg, ctx.mode = cfg, mode
        ctx.mark_non_differentiable(counts)
        return y, counts

    @staticmethod
    def backward(ctx, dy, _dcounts):
        if ctx.mode == 0 and getattr(ctx, "consumed", False):
            raise RuntimeError("moeblaze: this forward's saved activations were consumed by an earlier backward "
                               "(dH is written over them); run the forward again instead of retain_graph=True")
        ctx.consumed = True
        x, topk_weights, saved, state = ctx.saved_tensors
        w1, w3, w2, bias_up, bias_down = ctx.weights
        args = (dy.contiguous(), x, topk_weights, None, None, w1, w3, w2, bias_up, bias_down, saved, state, ctx.cfg,
                1.0)
        if ctx.main_grads is not None:
            dx, dtw, _ = _ops.backward_accumulate(*args, *ctx.main_grads)
            grads = [_dummy_for(w) if w is not None else None for w in ctx.weights]
        else:
            dx, dw1, dw3, dw2, dtw, _, dbu, dbd = _ops.backward(*args)
            grads = [g if w is not None else None for w, g in zip(ctx.weights, (dw1, dw3, dw2, dbu, dbd))]
        return (dx, dtw, *grads, None, None, None, None)


def moe(x: Tensor, w1: Tensor, w3: Optional[Tensor], w2: Tensor, *, topk_ids: Tensor, topk_weights: Tensor,
        gradient_accumulation_fusion: bool = True, activation: str = "swiglu", checkpoint: str = "save-h",
        bias_up: Optional[Tensor] = None, bias_down: Optional[Tensor] = None) -> Tensor:
    """The MoE layer on caller routing (as moeblaze.torch.moe: x [T, d] bf16, w1/w3 [E, n, d],
    w2 [E, d, n], w3=None with a gated activation for a fused gate_up [E, 2n, d]; topk_ids
    [T, K] int32, topk_weights [T, K] float32), returning y [T, d], with Megatron's
    gradient-accumulation fusion semantics for the expert weights and biases (see the module
    docstring)."""
    if checkpoint not in C.MODES:
        raise C.InvalidArgument("checkpoint", f"checkpoint: '{checkpoint}' is not one of save-h, recompute")
    mbt._check_devices(x=x, w1=w1, w3=w3, w2=w2, topk_ids=topk_ids, topk_weights=topk_weights, bias_up=bias_up,
                       bias_down=bias_down)
    for name, w in (("w1", w1), ("w2", w2), ("topk_ids", topk_ids)):
        if w.dim() != (2 if name == "topk_ids" else 3):
            raise C.InvalidArgument(name, f"{name}: has shape {list(w.shape)}")
    if (bias_up is None) != (bias_down is None):
        missing = "bias_down" if bias_down is None else "bias_up"
        raise C.InvalidArgument(missing, f"{missing}: expert biases come in pairs (bias_up and bias_down)")
    E, d, n = w2.shape
    fused = w3 is None and activation in C.GATED
    cfg = mbt._cfg_list(E, topk_ids.shape[1], d, n, activation, None, False, "fused" if fused else "separate",
                        bias_up is not None)
    # No gradient to accumulate (inference, frozen experts): no main_grad needed.
    fusion = bool(gradient_accumulation_fusion) and torch.is_grad_enabled() and w1.requires_grad
    y, _ = _FusedAccumulationMoE.apply(x, topk_weights, w1, w3, w2, bias_up, bias_down, topk_ids, cfg,
                                       C.MODES[checkpoint], fusion)
    return y


def topk_from_routing_map(probs: Tensor, routing_map: Tensor, top_k: int) -> Tuple[Tensor, Tensor]:
    """Megatron's router outputs (probs [T, E] float, zero off the picks; routing_map [T, E]
    bool, at most top_k picks per token) as (topk_ids int32 [T, K], topk_weights float32
    [T, K]); the weights stay differentiable in probs. A token with fewer picks (a dropped
    slot) fills it with an unpicked expert at weight 0, which adds nothing. No host sync."""
    if routing_map.dim() != 2 or probs.shape != routing_map.shape:
        raise C.InvalidArgument("routing_map", f"routing_map: must be [T, E] like probs {list(probs.shape)}, got "
                                               f"{list(routing_map.shape)}")
    ids = routing_map.to(torch.int8).topk(top_k, dim=-1, sorted=False).indices
    weights = probs.gather(-1, ids) * routing_map.gather(-1, ids)
    return ids.to(torch.int32).contiguous(), weights.float().contiguous()
