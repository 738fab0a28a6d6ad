"""Expert parallelism without a host sync: the exchange sizes stay on the device.

The NCCL path (ep.py) needs the split sizes of all_to_all_single on the host: one
device-to-host copy of the counts per layer call, which stalls the CPU until the GPU has
routed, and keeps the step out of a CUDA graph. Here the rows travel with
torch.ops.symm_mem.all_to_all_vdev (NVSHMEM symmetric memory), whose split sizes are a device
tensor, and the receiver's row count never reaches the host:
- receive buffers are sized for the worst case (every rank's rows to one rank): rows_max =
  ep_size * max_tokens * K, fixed by the caller's `max_tokens` (the same on every rank);
- moeblaze runs on all rows_max rows; rows past the received ones get the expert id E_local,
  which moeblaze's index build leaves out (no GEMM work; their outputs are never read);
- the counts travel with a fixed-size all_to_all_single (no host sizes needed).
So the whole EP step, routing to combine, is a fixed sequence of kernels and collectives.

Costs: moeblaze's saved state and scratch are planned for rows_max rows (ep_size times the
balanced case), a received-rows copy of that size is kept for backward, and the symmetric
buffers (send and receive, for the dispatch and the combine direction) are rows_max rows each
(deepseek-v3, ep 2, 16384 tokens: 3.8 GB each, 15 GB in all). No chunked
overlap on this path (chunks = 1), and ids outside [0, E) cannot be reported without a host
sync: ep_moe leaves them out before the dispatch (gate 0 on an expert of the rank itself:
_dispatch.leave_out_bad_ids); the all_to_all path raises on every rank instead.

Requirements: torch built with NVSHMEM (symm_mem.is_nvshmem_available()), one GPU per rank
(2 or more GPUs), and NCCL for the counts. Keep NVLink multicast off
(NVSHMEM_DISABLE_NVLS=1, TORCH_SYMM_MEM_DISABLE_MULTICAST=1). Written against torch 2.11's
all_to_all_vdev(input, out, in_splits, out_splits_offsets, group_name) on 1-D tensors with
splits in elements; NOT run here (no machine with two GPUs was available when it was
written): tests/test_ep_multi_gpu.py checks it against the NCCL path where it can run.
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _capi as C
from ._dispatch import DispatchPlan, gather_sum, padded_expert_ids, scatter_slots


class SymmBuffers:
    """Symmetric buffers of one process group, allocated once (collectively: every rank must
    ask for the same sizes in the same order) and reused by every layer call in stream order."""

    def __init__(self, group):
        import torch.distributed._symmetric_memory as symm_mem
        if not symm_mem.is_nvshmem_available():
            raise RuntimeError("moeblaze.ep: exchange='symm_mem' needs torch with NVSHMEM "
                               "(symm_mem.is_nvshmem_available() is False); use exchange='nccl'")
        self.symm = symm_mem
        self.group = group if group is not None else dist.group.WORLD
        self.group_name = self.group.group_name
        if symm_mem.get_backend(torch.device("cuda")) != "NVSHMEM":
            symm_mem.set_backend("NVSHMEM")
        symm_mem.enable_symm_mem_for_group(self.group_name)
        self._bufs: Dict[Tuple, Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device) -> Tensor:
        key = (name, dtype)
        t = self._bufs.get(key)
        if t is None or t.numel() < numel:
            t = self.symm.empty(numel, dtype=dtype, device=device)
            self.symm.rendezvous(t, group=self.group_name)
            self._bufs[key] = t
        return t[:numel]

    def all_to_all_vdev(self, inp: Tensor, out: Tensor, in_splits: Tensor, out_splits_offsets: Tensor) -> None:
        torch.ops.symm_mem.all_to_all_vdev(inp, out, in_splits, out_splits_offsets, self.group_name)


_buffers: Dict[str, SymmBuffers] = {}


def buffers_of(group) -> SymmBuffers:
    g = group if group is not None else dist.group.WORLD
    b = _buffers.get(g.group_name)
    if b is None:
        b = _buffers[g.group_name] = SymmBuffers(g)
    return b


class DeviceStep:
    """One layer call on the device-split path."""

    def __init__(self, bufs: SymmBuffers, engine, plan: DispatchPlan, recv_counts: Tensor, max_tokens: int):
        self.bufs, self.engine, self.plan, self.recv_counts = bufs, engine, plan, recv_counts
        self.world, self.max_slots = plan.world, max_tokens * plan.top_k
        self.rows_max = plan.world * self.max_slots

    def exchange(self, name: str, rows: Tensor, splits_rows: Tensor, out_rows: int) -> Tuple[Tensor, Tensor]:
        """rows [R, w...] (R <= the send buffer) go out by splits_rows (device, rows per rank);
        returns (the first out_rows received rows, the received rows per rank). `name` picks the
        buffers: "dispatch" and "combine" (and their "_gates") alternate in every step, so a buffer is written again
        only after another collective, whose entry every rank must have reached, has run: no
        rank's puts can land in a buffer another rank is still reading."""
        b = self.bufs
        width = math.prod(rows.shape[1:])
        send = b.get(name + ".send", max(self.rows_max, 1) * width, rows.dtype, rows.device)
        recv = b.get(name + ".recv", max(self.rows_max, 1) * width, rows.dtype, rows.device)
        send[:rows.numel()].copy_(rows.reshape(-1))
        splits = b.get(name + ".splits", self.world, torch.int64, rows.device)
        splits.copy_(splits_rows * width)
        so = b.get(name + ".out_splits_offsets", 2 * self.world, torch.int64, rows.device).view(2, self.world)
        b.all_to_all_vdev(send, recv, splits, so)
        shape = (out_rows,) + tuple(rows.shape[1:])
        return recv[:out_rows * width].view(shape), torch.div(so[0], width, rounding_mode="floor")


class _ExpertParallelDevice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gates, w1, w3, w2, step: DeviceStep):
        plan = step.plan
        send_rows = plan.send_counts.sum(1)
        tok = plan.send_tokens()
        # received rows, cloned out of the reused symmetric buffers: backward needs them
        rows, recv_rows = step.exchange("dispatch", x.index_select(0, tok), send_rows, step.rows_max)
        rows = rows.clone()
        g, _ = step.exchange("dispatch_gates", gates.reshape(-1, 1).index_select(0, plan.order), send_rows,
                             step.rows_max)
        g = g.reshape(-1).clone()
        ids = padded_expert_ids(step.recv_counts, step.rows_max)
        out, state = step.engine.forward(rows, ids, g, w1, w3, w2)
        back, _ = step.exchange("combine", out, recv_rows, plan.slots)
        ctx.step, ctx.state, ctx.send_rows, ctx.recv_rows = step, state, send_rows, recv_rows
        ctx.x_dtype, ctx.gate_dtype = x.dtype, gates.dtype
        ctx.set_materialize_grads(False)
        return gather_sum(back, plan.position, x.dtype)

    @staticmethod
    def backward(ctx, dy):
        if dy is None:
            return (None,) * 6
        if ctx.state is None:
            raise RuntimeError("moeblaze.ep: this forward was already backpropagated; run the forward again")
        step, state = ctx.step, ctx.state
        ctx.state = None
        plan = step.plan
        d_rows, _ = step.exchange("dispatch", dy.contiguous().index_select(0, plan.send_tokens()), ctx.send_rows,
                                  step.rows_max)
        d_x, d_g, dw1, dw3, dw2 = step.engine.backward(state, d_rows)
        dx_back, _ = step.exchange("combine", d_x, ctx.recv_rows, plan.slots)
        dx = gather_sum(dx_back, plan.position, ctx.x_dtype)
        dg_back, _ = step.exchange("combine_gates", d_g.reshape(-1, 1), ctx.recv_rows, plan.slots)
        return dx, scatter_slots(dg_back.reshape(-1), plan.position), dw1, dw3, dw2, None


def ep_step_device(x, topk_weights, w1, w3, w2, plan: DispatchPlan, group, engine, max_tokens: int) -> Tensor:
    """The EP layer with device-side exchange sizes (see the module docstring)."""
    if plan.chunks != 1:
        raise C.InvalidArgument("chunks", "chunks: the symm_mem exchange runs one chunk (chunks=1)")
    if max_tokens < plan.tokens:
        raise C.InvalidArgument("max_tokens", f"max_tokens: {max_tokens} is below this call's {plan.tokens} tokens")
    bufs = buffers_of(group)
    recv_counts = torch.empty_like(plan.send_counts)
    dist.all_to_all_single(recv_counts, plan.send_counts.contiguous(), group=bufs.group)
    step = DeviceStep(bufs, engine, plan, recv_counts, max_tokens)
    return _ExpertParallelDevice.apply(x, topk_weights, w1, w3, w2, step)
