"""Timing and memory of one suite case, the same for every implementation: forward and step
(forward + backward) median ms over CUDA events, activation memory held between forward and
backward beyond the output, and the peak extra memory of a step with the weight gradients
left out (bench/peak_memory.py)."""
from __future__ import annotations

import torch

from impls import Impl
from peak_memory import step_peak_bytes


def median_ms(fn, steps, warmup=3):
    """Median and half the 10-90% spread of per-call times. Events are recorded around each
    call without a host sync in between, so the host runs ahead of the GPU as in training and
    launch overhead is only counted where the GPU would wait for it."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for a, b in events:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in events)
    return times[len(times) // 2], (times[int(0.9 * (len(times) - 1))] - times[int(0.1 * (len(times) - 1))]) / 2


def ceilings():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms, _ = median_ms(lambda: a @ a, 10)
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    cms, _ = median_ms(lambda: dst.copy_(src), 10)
    return {"gemm_tflops": 2 * 8192 ** 3 / ms / 1e9, "copy_tbps": 2 * src.numel() / cms / 1e9}


def step_fn(impl: Impl, dy):
    def step():
        # As a training step with zero_grad(set_to_none=True): the weight gradients are
        # fresh tensors, not accumulated into old ones (an extra read-add-write of every
        # weight that is the optimizer's business, not the layer's).
        for t in impl.leaves:
            t.grad = None
        impl.forward().backward(dy)
    return step


def measure(impl: Impl, dy, flops: float, steps: int) -> dict:
    """fwd_ms, step_ms (+ spread), TFLOP/s, act_mib, peak_mib (trace) and peak_alloc_mib
    (max_memory_allocated minus every weight gradient). The first step (module load, a peer's
    autotuning) stays out of every number."""
    step = step_fn(impl, dy)
    step()
    fwd_ms, _ = median_ms(lambda: impl.forward(), steps)
    step_ms, spread = median_ms(step, steps)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = impl.forward()
    act = torch.cuda.memory_allocated() - base - y.numel() * y.element_size()
    del y
    for t in impl.leaves:  # the base holds no gradients: the step makes its own
        t.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    weight_grads = sum(p.numel() * p.element_size() for p in impl.params)
    peak_alloc = torch.cuda.max_memory_allocated() - base - weight_grads  # all grads taken off the peak
    for t in impl.leaves:
        t.grad = None
    peak = step_peak_bytes(step, lambda: [p.grad for p in impl.params])  # grads excluded at every moment
    for t in impl.leaves:
        t.grad = None
    return {"fwd_ms": fwd_ms, "step_ms": step_ms, "step_spread_ms": spread, "tflops": flops / step_ms / 1e9,
            "act_mib": act / 2 ** 20, "peak_mib": peak / 2 ** 20, "peak_alloc_mib": peak_alloc / 2 ** 20,
            "routing_path": impl.routing_path}
