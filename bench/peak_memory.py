"""Peak extra memory of one step, with the weights' gradients excluded at every moment.

`torch.cuda.max_memory_allocated() - base - sum(grad bytes)` undercounts any implementation
whose weight gradients appear one by one during the backward (autograd's): at its peak only
some of them exist, yet all are subtracted, and the result can fall below the activations it
holds (torch-grouped_mm on gpt-oss-20b: "peak" 2006 MiB with 2715 MiB of activations). Here the
allocator's event trace is replayed instead: live bytes after each allocation event, where the
allocation that ends up holding a weight gradient never counts. Both methods are reported
(peak_mib = trace, peak_alloc_mib = the subtraction), the same for every implementation.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Sequence, Tuple


def peak_from_trace(events: Iterable[dict], excluded: Sequence[Tuple[int, int]]) -> int:
    """Highest sum of live allocation bytes over the trace, allocations made inside it only
    (frees of blocks allocated before it are ignored: the base is what was live before).
    `excluded`: (address, bytes) of tensors alive after the trace to leave out (the weight
    gradients); the bytes are taken off the block that holds them at the end of the trace, for
    its whole life (an earlier, freed block at the same address counts in full)."""
    events = list(events)
    open_at: Dict[int, int] = {}  # address -> index of its allocation still live
    for i, e in enumerate(events):
        if e.get("action") == "alloc":
            open_at[e["addr"]] = i
        elif e.get("action") == "free_completed":
            open_at.pop(e.get("addr"), None)
    live_at_end = set(open_at.values())
    live: Dict[int, int] = {}  # address -> counted bytes of allocations made in the trace
    total = peak = 0
    for i, e in enumerate(events):
        action, addr, size = e.get("action"), e.get("addr"), e.get("size", 0)
        if action == "alloc":
            counted = size
            if i in live_at_end:
                for a, b in excluded:
                    if addr <= a < addr + size:
                        counted -= min(b, addr + size - a)
            counted = max(counted, 0)
            live[addr] = counted
            total += counted
            peak = max(peak, total)
        elif action == "free_completed" and addr in live:
            total -= live.pop(addr)
    return peak


def step_peak_bytes(step: Callable[[], None], grads: Callable[[], List]) -> int:
    """Runs `step` once under the allocator's event recording; `grads()` (called after the
    step) lists the gradient tensors to exclude. Returns the peak extra bytes."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=1_000_000)
    try:
        step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    dev = torch.cuda.current_device()
    traces = snap["device_traces"][dev]
    if not any(e.get("action") == "alloc" for e in traces):
        raise RuntimeError("the allocator trace holds no allocations: cannot measure the peak")
    excluded = [(g.data_ptr(), g.numel() * g.element_size()) for g in grads() if g is not None]
    return peak_from_trace(traces, excluded)
