"""Caller routing on its way into the kernels: expert ids narrowed to int32 without wrapping,
and whether a forward reads the routing status.

The index build leaves a slot whose id is outside [0, E) out (no expert computes it, it adds
nothing to y or dx, its gate gradient is 0) and flags it in the layer's status word. Reading
that word is a host sync, so it is decided here, once, for every caller-routing entry point
(moeblaze.torch.moe, MoE.forward with router=None, moeblaze.hf)."""
from __future__ import annotations

import torch
from torch import Tensor

# An id outside every expert range: what a narrowed id becomes when it does not fit [0, E).
# The index build treats it like any other bad id (left out, flagged).
LEFT_OUT_ID = -1


def narrow_expert_ids(ids: Tensor, num_experts: int) -> Tensor:
    """int32 expert ids for the kernels from ids of any integer dtype. An id outside
    [0, num_experts) becomes LEFT_OUT_ID before the cast, so that a wide id never wraps onto
    a real expert (int64 2**32 + 3 would otherwise become expert 3). Runs on the ids' device,
    without a host sync; int32 ids pass through unchanged (the index build checks their range)."""
    if ids.dtype == torch.int32:
        return ids
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        from ._capi import InvalidArgument
        raise InvalidArgument("topk_ids", f"topk_ids: must hold integer expert ids, got {ids.dtype}")
    wide = ids.to(torch.int64)  # lossless (no copy for int64), and -1 fits unsigned ids too
    bad = (wide < 0) | (wide >= num_experts)
    return wide.masked_fill(bad, LEFT_OUT_ID).to(torch.int32)


def routing_check_active(requested: bool) -> bool:
    """Whether this forward reads the routing status and raises on a bad id: when asked, but
    never while the current stream is being captured into a CUDA graph, where a host sync is
    illegal (the capture would fail); a captured forward leaves bad ids out without raising."""
    if not requested:
        return False
    # A process that never touched CUDA captures nothing (and asking would initialise CUDA).
    return not (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())
