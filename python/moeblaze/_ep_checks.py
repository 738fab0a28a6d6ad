"""Collective checks of expert parallelism: what keeps one rank's bad input from hanging or
crashing the others.

Every rank of the group takes part in each collective of a layer call. A rank that raised on
its own before one of them would leave the others waiting there until the collective's
timeout (NCCL's default is 10 minutes), and ranks whose collectives differ in size crash
inside the backend (gloo aborts on a mis-sized receive). So:
- at the first call of a layout on a group, the ranks all-gather the values the exchanges
  depend on (E, the experts each rank holds, K, chunks, d, the exchange kind) and every rank
  raises, naming the first value that differs and what each rank has;
- every call's counts exchange carries one status column more: 0, the number of this rank's
  expert ids outside [0, E), or the code of the argument this rank found bad. Every rank reads
  all of them in the one device-to-host copy the split sizes need anyway, and raises before
  any row is exchanged when one is not 0.
The decisions (what differs, which error to raise) are plain functions of host values, tested
without processes (python/tests/test_ep_checks.py); test_ep_gloo.py runs them over gloo."""
from __future__ import annotations

import operator
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._capi import InvalidArgument
from ._dispatch import DispatchPlan, HostSplits, chunk_counts, splits_from_host

EXCHANGES = ("all_to_all", "symm_mem")  # ep_moe's exchange kinds
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)  # of the rows and gates that travel

# The layout values, in the order they are gathered: (what the message calls it, the argument
# that carries it, the names of its codes when it is a choice: -1 none, len(names) another).
LAYOUT = (("num_experts", "num_experts", None), ("experts on the rank (w1.shape[0])", "w1", None),
          ("top_k (topk_ids.shape[1])", "topk_ids", None), ("chunks", "chunks", None),
          ("hidden size (x.shape[-1])", "x", None), ("exchange", "exchange", EXCHANGES),
          ("dtype of x", "x", DTYPES), ("dtype of topk_weights", "topk_weights", DTYPES))

# Arguments a rank can find bad on its own; a status of -(1 + i) names STATUS_ARGUMENTS[i].
STATUS_ARGUMENTS = ("x", "topk_ids", "topk_weights", "w1", "w3", "w2", "num_experts", "chunks", "max_tokens")

_agreed: set = set()  # (group, layout values) already agreed on


def _int_or(v, default: int = -1) -> int:
    if isinstance(v, bool):
        return default
    try:
        return operator.index(v)
    except TypeError:
        return default


def _dim(t, i: int) -> int:
    """t.shape[i] of a tensor with that dimension, else -1 (a malformed argument still gathers)."""
    if not isinstance(t, Tensor) or t.dim() <= (i if i >= 0 else -i - 1):
        return -1
    return int(t.shape[i])


def _code(v, names) -> int:
    """v's index in names, -1 for None, len(names) for anything else."""
    if v is None:
        return -1
    return names.index(v) if v in names else len(names)


def layout_values(x, topk_ids, topk_weights, w1, num_experts, chunks, exchange) -> Tuple[int, ...]:
    """The values of LAYOUT for one rank's call, -1 where an argument cannot give one."""
    def dtype(t):
        return _code(t.dtype if isinstance(t, Tensor) else None, DTYPES)
    return (_int_or(num_experts), _dim(w1, 0), _dim(topk_ids, 1), _int_or(chunks), _dim(x, -1),
            _code(exchange if isinstance(exchange, str) else "?", EXCHANGES), dtype(x), dtype(topk_weights))


def layout_mismatch(gathered: Sequence[Sequence[int]]) -> Optional[InvalidArgument]:
    """The error every rank raises when the ranks' layout values (gathered[rank]) differ: it
    names the first value that differs and what each rank has; None when they agree."""
    for i, (what, argument, names) in enumerate(LAYOUT):
        column = [row[i] for row in gathered]
        if len(set(column)) > 1:
            def show(v):
                if v < 0:
                    return "none"
                if names is None:
                    return str(v)
                return str(names[v]).replace("torch.", "") if v < len(names) else "another"
            per_rank = ", ".join(f"rank {r}: {show(v)}" for r, v in enumerate(column))
            return InvalidArgument(argument, f"{argument}: the ranks of the expert-parallel group disagree on the "
                                             f"{what} ({per_rank}); every rank must call the layer with the same "
                                             "layout")
    return None


def agree_on_layout(exchange, values: Tuple[int, ...], device: torch.device) -> None:
    """All-gathers this rank's layout values at the first call of that layout on the group
    (one small collective and one host copy; later calls with the same values skip it) and
    raises layout_mismatch's error on every rank when they differ. A rank that changes its
    layout between calls takes part again, alone: keep the layout the same on every rank."""
    key = (exchange.key, tuple(values))
    if key in _agreed:
        return
    err = layout_mismatch(exchange.gather_ints(values, device))
    if err is not None:
        raise err
    _agreed.add(key)


def status_of_error(e: InvalidArgument) -> int:
    """The status column's code of an argument error found on this rank."""
    name = e.argument if e.argument in STATUS_ARGUMENTS else "x"
    return -(1 + STATUS_ARGUMENTS.index(name))


def status_error(statuses: Sequence[int], rank: int, num_experts: int, slots: int,
                 own: Optional[InvalidArgument]) -> Optional[InvalidArgument]:
    """The error this rank raises after the counts exchange, or None when every status is 0.
    statuses[r]: rank r's status (0, a count of ids outside [0, E), or -(1 + argument index));
    own: the error this rank found in its own arguments (raised as it is)."""
    if own is not None:
        return own
    if statuses[rank] > 0:
        return InvalidArgument("topk_ids", f"topk_ids: {statuses[rank]} of {slots} expert ids are outside "
                                           f"[0, {num_experts}) (the other ranks of the expert-parallel group stop "
                                           "at this call too)")
    for r, s in enumerate(statuses):
        if s > 0:
            return InvalidArgument("topk_ids", f"topk_ids: rank {r} of the expert-parallel group passed {s} expert ids "
                                               f"outside [0, {num_experts}); every rank stops at this call")
        if s < 0:
            i = -s - 1
            name = STATUS_ARGUMENTS[i] if i < len(STATUS_ARGUMENTS) else "x"
            return InvalidArgument(name, f"{name}: rank {r} of the expert-parallel group was called with a bad {name} "
                                         "(its own error says what); every rank stops at this call")
    return None


def counts_with_status(plan: Optional[DispatchPlan], own: Optional[InvalidArgument], world: int, local: int,
                       device: torch.device) -> Tensor:
    """[world, local + 1] int64: the per-(rank, local expert) send counts (zeros when this rank
    has no plan) and, in the last column of every row, this rank's status: every rank receives
    it. Built on the device: the bad-id count is slots - the counted slots, no host sync."""
    out = torch.zeros(world, local + 1, dtype=torch.int64, device=device)
    if plan is None:
        out[:, local] = status_of_error(own) if own is not None else 0
        return out
    out[:, :local] = plan.send_counts
    out[:, local] = plan.slots - plan.send_counts.sum()
    return out


def exchange_counts(exchange, plan: Optional[DispatchPlan], own: Optional[InvalidArgument], num_experts: int,
                    local: int, chunks: int, device: torch.device) -> Tuple[Tensor, HostSplits]:
    """The counts exchange with the status column: returns the received [world, local] counts
    and the host split sizes (one device-to-host copy), or raises status_error's error, on
    every rank alike, before any row travels."""
    world = exchange.world
    send = counts_with_status(plan, own, world, local, device)
    recv = exchange.counts(send)
    send_counts, recv_counts = send[:, :local], recv[:, :local]
    host = torch.cat([chunk_counts(send_counts, chunks).reshape(-1), chunk_counts(recv_counts, chunks).reshape(-1),
                      recv[:, local]]).cpu().tolist()
    n = chunks * world
    statuses = host[2 * n:]
    err = status_error(statuses, exchange.rank, num_experts, plan.slots if plan is not None else 0, own)
    if err is not None:
        raise err
    return recv_counts, splits_from_host(host[:n], host[n:2 * n], chunks, world)
