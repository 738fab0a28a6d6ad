"""Argument checks that happen in Python, before the C ABI sees anything: numbers (type, C
range, finiteness), device, contiguity, dtype, shape, alignment. They work on plain values
and on a small description of a tensor (TensorInfo), so they are tested without torch or a
GPU; moeblaze.torch builds the descriptions from torch tensors. The C ABI checks everything
again on its own (core/checked.hpp): these checks exist so that ctypes never truncates a
value (2**32 + 8 would reach C as 8) and so that errors name the Python argument."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Optional, Sequence

from ._capi import InvalidArgument

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def check_int(name: str, value, lo: int, hi: int) -> int:
    """`value` as an int when it is an integer (not a bool, not a float) in [lo, hi]."""
    if isinstance(value, bool):
        raise InvalidArgument(name, f"{name}: must be an integer, got a bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidArgument(name, f"{name}: must be an integer, got {type(value).__name__}") from None
    if not lo <= v <= hi:
        raise InvalidArgument(name, f"{name}: {v} is outside [{lo}, {hi}]")
    return v


def check_real(name: str, value, lo: float, hi: float, positive: bool = False) -> float:
    """`value` as a float when it is a finite real number in [lo, hi] (and > 0 if positive)."""
    if isinstance(value, bool):
        raise InvalidArgument(name, f"{name}: must be a number, got a bool")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(name, f"{name}: must be a number, got {type(value).__name__}") from None
    if not math.isfinite(v):
        raise InvalidArgument(name, f"{name}: {v} is not a finite number")
    if not lo <= v <= hi or (positive and v <= 0):
        raise InvalidArgument(name, f"{name}: {v} is outside {'(' if positive else '['}{lo}, {hi}]")
    return v


def check_device(name: str, device_type: str) -> None:
    """Raises InvalidArgument naming `name` unless the tensor is on a CUDA device (before any
    dispatch: torch would answer a CPU tensor with NotImplementedError)."""
    if device_type != "cuda":
        raise InvalidArgument(name, f"{name}: is on {device_type}, expected a CUDA tensor (moeblaze runs on NVIDIA GPUs)")


@dataclass(frozen=True)
class TensorInfo:
    dtype: str             # "bf16", "f32", "i32", or anything else (rejected)
    device_type: str       # "cuda", "cpu", ...
    device_index: int
    shape: tuple
    contiguous: bool
    ptr: int


def check_tensor(name: str, t: Optional[TensorInfo], dtype: str, shape: Sequence[int], device: int,
                 required: bool = True) -> None:
    """Raises InvalidArgument naming `name` when t does not fit."""
    if t is None:
        if required:
            raise InvalidArgument(name, f"{name}: is required")
        return
    if t.device_type != "cuda":
        raise InvalidArgument(name, f"{name}: is on {t.device_type}, expected a CUDA tensor")
    if t.device_index != device:
        raise InvalidArgument(name, f"{name}: is on cuda:{t.device_index}, expected cuda:{device} like x")
    if t.dtype != dtype:
        raise InvalidArgument(name, f"{name}: has dtype {t.dtype}, expected {dtype}")
    if tuple(t.shape) != tuple(shape):
        raise InvalidArgument(name, f"{name}: has shape {list(t.shape)}, expected {list(shape)}")
    if not t.contiguous:
        raise InvalidArgument(name, f"{name}: is not contiguous (call .contiguous())")
    if t.ptr % 16:
        raise InvalidArgument(name, f"{name}: data pointer {t.ptr:#x} is not 16-byte aligned")


def check_moe_args(cfg, x: TensorInfo, topk_ids: Optional[TensorInfo], topk_weights: Optional[TensorInfo],
                   w_router: Optional[TensorInfo], router_bias: Optional[TensorInfo], w1: TensorInfo,
                   w3: Optional[TensorInfo], w2: TensorInfo, bias_up: Optional[TensorInfo] = None,
                   bias_down: Optional[TensorInfo] = None) -> int:
    """Checks the inputs of a forward for the layer config; returns T."""
    E, K, d, n = cfg.experts, cfg.topk, cfg.hidden, cfg.ffn
    if x is None:
        raise InvalidArgument("x", "x: is required")
    if len(x.shape) != 2:
        raise InvalidArgument("x", f"x: must be 2-D [tokens, {d}], got shape {list(x.shape)}")
    T = int(x.shape[0])
    if T < 1:
        raise InvalidArgument("x", "x: has no tokens")
    dev = x.device_index
    check_tensor("x", x, "bf16", (T, d), dev)
    if cfg.router == 0:
        check_tensor("topk_ids", topk_ids, "i32", (T, K), dev)
        check_tensor("topk_weights", topk_weights, "f32", (T, K), dev)
        if w_router is not None:
            raise InvalidArgument("w_router", "w_router: given, but the layer has no built-in router")
    else:
        check_tensor("w_router", w_router, "bf16", (E, d), dev)
        if topk_ids is not None:
            raise InvalidArgument("topk_ids", "topk_ids: given, but the built-in router computes the picks")
        if router_bias is not None:
            if cfg.router != 2:
                raise InvalidArgument("router_bias", "router_bias: only the sigmoid router takes a bias")
            check_tensor("router_bias", router_bias, "f32", (E,), dev)
    fused = getattr(cfg, "weight_layout", 0) == 1
    check_tensor("w1", w1, "bf16", (E, 2 * n if fused else n, d), dev)
    gated = cfg.activation in (0, 1, 5)
    if fused:
        if w3 is not None:
            raise InvalidArgument("w3", "w3: given, but with a fused gate_up W3 is the second half of w1's rows")
    elif gated:
        check_tensor("w3", w3, "bf16", (E, n, d), dev)
    elif w3 is not None:
        raise InvalidArgument("w3", "w3: given, but a plain activation uses w1 alone")
    check_tensor("w2", w2, "bf16", (E, d, n), dev)
    if getattr(cfg, "expert_bias", 0):
        check_tensor("bias_up", bias_up, "bf16", (E, (2 if gated else 1) * n), dev)
        check_tensor("bias_down", bias_down, "bf16", (E, d), dev)
    else:
        for name, b in (("bias_up", bias_up), ("bias_down", bias_down)):
            if b is not None:
                raise InvalidArgument(name, f"{name}: given, but the layer has no expert biases")
    return T
