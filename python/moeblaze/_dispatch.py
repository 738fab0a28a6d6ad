"""Expert-parallel dispatch bookkeeping: which (token, k) slot goes to which rank, in which
order, and how the results find their way back. Plain torch on whatever device the routing
is on; no communication here (that is `_exchange`), so all of it is tested on the CPU.

Experts are sharded contiguously: global expert e lives on rank e // E_local as local expert
e % E_local. The local experts are split into `chunks` equal groups; chunk c of every rank
holds its local experts [c E_c, (c+1) E_c), E_c = E_local / chunks.

Send order: slots sorted (stably) by (chunk, global expert), so that
- each chunk's rows are one contiguous range of the send buffer, the rows for each
  destination rank one contiguous range inside it (all_to_all_single's splits);
- inside an expert, slots keep their (token, k) order.
A receiver gets, per chunk, the blocks of every source rank in rank order, each sorted by
local expert. The expert compute builds its index arrays from the received expert ids, so an
expert's rows are (source rank, token) ascending: with the batches of the ranks concatenated
in rank order that is the order one rank would see for the same global batch, which is what
makes expert parallelism reproduce EP = 1 bit for bit (weight gradients reduce over an
expert's rows in row order).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch
from torch import Tensor

from ._capi import InvalidArgument


def check_layout(num_experts: int, world: int, chunks: int) -> int:
    """E_local, after checking that the experts shard evenly over ranks and chunks."""
    if world < 1:
        raise InvalidArgument("world", f"world: must be >= 1, got {world}")
    if num_experts < 1 or num_experts % world:
        raise InvalidArgument("num_experts", f"num_experts: {num_experts} experts do not shard evenly over "
                              f"{world} ranks")
    local = num_experts // world
    if chunks < 1 or local % chunks:
        raise InvalidArgument("chunks", f"chunks: {local} local experts do not split into {chunks} equal chunks")
    return local


@dataclass
class DispatchPlan:
    """Where each of this rank's T*K slots goes (device tensors, no host values)."""
    num_experts: int
    world: int
    chunks: int
    top_k: int
    tokens: int
    order: Tensor        # int64 [S]: the slot (t*K + j) at each send position
    position: Tensor     # int64 [T, K]: the send position of slot (t, j); order[position] = slot
    send_counts: Tensor  # int64 [world, E_local]: slots per destination rank and its local expert

    @property
    def experts_local(self) -> int:
        return self.num_experts // self.world

    @property
    def slots(self) -> int:
        return self.tokens * self.top_k

    def send_tokens(self) -> Tensor:
        """Token of each send row (the row of x, or of dy in backward, that it carries)."""
        return torch.div(self.order, self.top_k, rounding_mode="floor")


def plan_dispatch(topk_ids: Tensor, num_experts: int, world: int, chunks: int = 1) -> DispatchPlan:
    """The send order for `topk_ids` [T, K] (global expert ids). No host synchronisation:
    counts come from the sorted keys by binary search (no atomics, no bincount). Ids outside
    [0, E) are in no count, and sort after every counted slot: the rows that travel are the
    counted ones, first in the send order (slots - the counted ones is how many were bad)."""
    if topk_ids.dim() != 2:
        raise InvalidArgument("topk_ids", f"topk_ids: must be [T, K], got shape {list(topk_ids.shape)}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
        raise InvalidArgument("topk_ids", f"topk_ids: must hold integer expert ids, got {topk_ids.dtype}")
    local = check_layout(num_experts, world, chunks)
    per_chunk = local // chunks
    T, K = topk_ids.shape
    e = topk_ids.reshape(-1).to(torch.int64)
    key = ((e % local) // per_chunk) * num_experts + e
    key = torch.where((e >= 0) & (e < num_experts), key, torch.full_like(key, chunks * num_experts))
    sorted_key, order = torch.sort(key, stable=True)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=order.device)
    experts = torch.arange(num_experts, device=e.device)
    expert_key = ((experts % local) // per_chunk) * num_experts + experts
    counts = (torch.searchsorted(sorted_key, expert_key, right=True) -
              torch.searchsorted(sorted_key, expert_key, right=False))
    return DispatchPlan(num_experts, world, chunks, K, T, order, position.view(T, K), counts.view(world, local))


def chunk_counts(counts: Tensor, chunks: int) -> Tensor:
    """[world, E_local] rows per (rank, local expert) -> [chunks, world] rows per (chunk, rank)."""
    W, local = counts.shape
    return counts.reshape(W, chunks, local // chunks).sum(-1).t()


@dataclass
class HostSplits:
    """The split sizes all_to_all_single needs on the host (one device-to-host copy of the
    counts per exchange on the NCCL path)."""
    send: List[List[int]]   # [chunk][rank]: rows this rank sends to each rank
    recv: List[List[int]]   # [chunk][rank]: rows this rank receives from each rank

    def send_range(self, chunk: int) -> tuple:
        start = sum(sum(s) for s in self.send[:chunk])
        return start, start + sum(self.send[chunk])

    def recv_rows(self, chunk: int) -> int:
        return sum(self.recv[chunk])


def splits_from_host(send: List[int], recv: List[int], chunks: int, world: int) -> HostSplits:
    """HostSplits from the [chunks, world] send and receive rows, flattened, on the host."""
    return HostSplits([send[c * world:(c + 1) * world] for c in range(chunks)],
                      [recv[c * world:(c + 1) * world] for c in range(chunks)])


def host_splits(send_counts: Tensor, recv_counts: Tensor, chunks: int, slots: int) -> HostSplits:
    """Split sizes per chunk from the [world, E_local] send and receive counts, in one copy.
    The send counts must add up to this rank's slots: ids outside [0, E) are caught here, on
    this rank only (the layer itself uses _ep_checks.exchange_counts, which stops every rank)."""
    both = torch.stack([chunk_counts(send_counts, chunks), chunk_counts(recv_counts, chunks)]).cpu()
    send, recv = both[0].tolist(), both[1].tolist()
    sent = sum(map(sum, send))
    if sent != slots:
        raise InvalidArgument("topk_ids", f"topk_ids: {slots - sent} of {slots} expert ids are outside "
                              f"[0, {send_counts.numel()})")
    return HostSplits(send, recv)


def leave_out_bad_ids(topk_ids: Tensor, topk_weights: Tensor, num_experts: int,
                      stand_in: int) -> Tuple[Tensor, Tensor]:
    """For the exchange without a host sync (symm_mem), which cannot raise on a bad id: each id
    outside [0, E) is replaced by `stand_in` (an expert of this rank, so the row does not
    travel) with gate 0. The row then adds exactly 0 to y and dx, and nothing to any weight
    gradient (every one of its terms is scaled by the gate), and torch.where gives its gate
    the gradient 0: the pick is left out, as moeblaze.torch.moe(check_routing=False) does."""
    bad = (topk_ids < 0) | (topk_ids >= num_experts)
    ids = topk_ids.masked_fill(bad, stand_in)
    weights = torch.where(bad, torch.zeros_like(topk_weights), topk_weights)
    return ids, weights


def received_expert_ids(recv_counts: Tensor, chunk: int, chunks: int, rows: int) -> Tensor:
    """Local expert id, within the chunk (0 .. E_c-1), of each row received for `chunk`: per
    source rank (rank order) a run of rows per expert (expert order). int32 [rows], built on
    the device from the counts (rows: their host-known total, so that nothing syncs)."""
    W, local = recv_counts.shape
    per_chunk = local // chunks
    counts = recv_counts[:, chunk * per_chunk:(chunk + 1) * per_chunk].reshape(-1)
    ids = torch.arange(per_chunk, device=recv_counts.device, dtype=torch.int32).repeat(W)
    return torch.repeat_interleave(ids, counts, output_size=rows)


def padded_expert_ids(recv_counts: Tensor, rows: int) -> Tensor:
    """Local expert id of each of `rows` receive-buffer rows when the received rows fill its
    start (one chunk: per source rank a run per expert) and the count stays on the device:
    rows past the received ones get E_local, an id moeblaze's index build leaves out."""
    W, local = recv_counts.shape
    ends = torch.cumsum(recv_counts.reshape(-1), 0)
    seg = torch.searchsorted(ends, torch.arange(rows, device=recv_counts.device, dtype=ends.dtype), right=True)
    return torch.where(seg < W * local, seg % local, torch.full_like(seg, local)).to(torch.int32)


def gather_sum(rows: Tensor, position: Tensor, out_dtype: torch.dtype, kernel: bool = True) -> Tensor:
    """out[t] = sum over j = 0 .. K-1, in that order, of rows[position[t, j]], accumulated in
    (at least) float32 and rounded once. Elementwise adds only: the result of a token does not
    depend on how many tokens, ranks or chunks there are (a reduction kernel could pick its
    order by shape). This is the combine in forward and the token gradient in backward. On a
    GPU with Triton one kernel (_gather_sum_kernel) gives the same bits in one pass;
    kernel=False forces the PyTorch form."""
    from . import _gather_sum_kernel
    if kernel and _gather_sum_kernel.available(rows) and out_dtype in (torch.bfloat16, torch.float16, torch.float32):
        return _gather_sum_kernel.gather_sum(rows, position, out_dtype)
    acc_dtype = torch.promote_types(rows.dtype, torch.float32)
    T, K = position.shape
    if T == 0:
        return rows.new_empty((0,) + tuple(rows.shape[1:]), dtype=out_dtype)
    acc = rows.index_select(0, position[:, 0]).to(acc_dtype)
    for j in range(1, K):
        acc += rows.index_select(0, position[:, j]).to(acc_dtype)
    return acc.to(out_dtype)


def scatter_slots(values: Tensor, position: Tensor) -> Tensor:
    """Per-send-row values [S] back to slot order [T, K] (the gate gradient)."""
    return values.index_select(0, position.reshape(-1)).view(position.shape)


def sent_bytes(splits: HostSplits, rank: int, row_bytes: int) -> int:
    """Bytes this rank sends to other ranks (its own rows stay local) for rows of row_bytes."""
    return row_bytes * sum(n for chunk in splits.send for r, n in enumerate(chunk) if r != rank)


def received_bytes(splits: HostSplits, rank: int, row_bytes: int) -> int:
    return row_bytes * sum(n for chunk in splits.recv for r, n in enumerate(chunk) if r != rank)


def chunk_experts(local: int, chunks: int, chunk: int) -> Tuple[int, int]:
    """Local expert range [lo, hi) of a chunk."""
    per_chunk = local // chunks
    return chunk * per_chunk, (chunk + 1) * per_chunk
