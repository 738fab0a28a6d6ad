"""The exchanges of expert parallelism over a torch.distributed process group: the counts
(fixed size) and the rows (all_to_all_single with host-known split sizes), started
asynchronously so that the exchange of one chunk runs while another computes.

NCCL runs the collective on its own stream, ordered after the work queued so far on the
caller's stream; `Pending.wait()` makes the caller's stream wait for it (no host sync).
gloo has no all-to-all for CUDA tensors and cannot run NCCL's two-ranks-on-one-GPU refusal
away, so with gloo a CUDA tensor is staged through host memory (a synchronous copy: a test
path, never a fast one)."""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor


class Pending:
    """An exchange in flight; wait() returns its output (on the caller's stream)."""

    def __init__(self, work, out: Tensor, staged: Optional[Tensor] = None):
        self._work, self._out, self._staged = work, out, staged

    def wait(self) -> Tensor:
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._staged is not None:
            self._out.copy_(self._staged)
            self._staged = None
        return self._out


class Exchange:
    """all_to_all_single over one process group (the expert-parallel group)."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("moeblaze.ep: torch.distributed is not initialised (init_process_group first)")
        self.group = group if group is not None else dist.group.WORLD
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.backend = str(dist.get_backend(self.group)).lower()

    def _staged(self, t: Tensor) -> bool:
        return t.is_cuda and "gloo" in self.backend

    @property
    def key(self):
        """What identifies the group across calls (the collective checks remember per group)."""
        name = getattr(self.group, "group_name", None)
        return name if name is not None else id(self.group)

    def gather_ints(self, values: Sequence[int], device: torch.device) -> List[List[int]]:
        """Every rank's `values` (the same number of them on every rank), in rank order, on
        the host: one all_gather and one device-to-host copy (on `device` for NCCL, host
        memory for gloo)."""
        t = torch.tensor([int(v) for v in values], dtype=torch.int64)
        if device.type == "cuda" and "gloo" not in self.backend:
            t = t.to(device)
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t, group=self.group)
        return torch.stack(parts).cpu().tolist()

    def rows(self, inp: Tensor, out_splits: List[int], in_splits: List[int], out: Optional[Tensor] = None) -> Pending:
        """Starts the exchange of inp's rows (dim 0): in_splits[r] rows to rank r, out_splits[r]
        rows from rank r, into `out` (allocated when None; a contiguous row range of a larger
        buffer is fine)."""
        inp = inp.contiguous()
        rows_out = sum(out_splits)
        if out is None:
            out = inp.new_empty((rows_out,) + tuple(inp.shape[1:]))
        if self._staged(inp):
            src = inp.cpu()
            dst = torch.empty(out.shape, dtype=out.dtype)
            work = dist.all_to_all_single(dst, src, out_splits, in_splits, group=self.group, async_op=True)
            return Pending(work, out, dst)
        work = dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group, async_op=True)
        return Pending(work, out)

    def counts(self, send_counts: Tensor) -> Tensor:
        """[world, X] -> [world, X]: row r goes to rank r; row r of the result came from rank r."""
        send_counts = send_counts.contiguous()
        out = torch.empty_like(send_counts)
        if self._staged(send_counts):
            dst = torch.empty(out.shape, dtype=out.dtype)
            dist.all_to_all_single(dst, send_counts.cpu(), group=self.group)
            return out.copy_(dst)
        dist.all_to_all_single(out, send_counts, group=self.group)
        return out
