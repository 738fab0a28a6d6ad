#!/usr/bin/env python3
"""Gradient accumulation on one deepseek-v3 MoE layer (E=256, K=8, d=7168, n=2048: 22.5 GB of
expert weights, as much again in gradients): a micro-batch's forward + backward when the
weights already hold gradients, with moeblaze adding into them in its weight-gradient
epilogues, against moeblaze returning fresh gradients (autograd allocates and adds) and
torch._grouped_mm's autograd (the torchtitan recipe, bench/baselines.py). Step time (median
of --steps, CUDA events) and the step's peak memory above what it starts from (weights and
existing gradients already resident).

    python bench/accumulate.py [--tokens 16384] [--steps 10] [--json out.json] [--main-grad]

--main-grad adds the fp32 main-gradient case (Megatron's main_grad: +45 GB).
Caller routing (random picks, softmax weights) so that only the experts are measured.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baselines import torch_grouped_mm  # noqa: E402
from measure import median_ms  # noqa: E402

E, K, D, N = 256, 8, 7168, 2048


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--main-grad", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("accumulate: needs a CUDA GPU")
    import moeblaze.torch as mbt

    T = args.tokens
    g = torch.Generator(device="cuda").manual_seed(0)

    def uniform(*shape, fan_in):
        return ((torch.rand(*shape, generator=g, device="cuda") * 2 - 1) * (3 / fan_in) ** 0.5).bfloat16()

    gate_up = uniform(E, 2 * N, D, fan_in=D).requires_grad_()  # the Hugging Face fused layout
    w2 = uniform(E, D, N, fan_in=N).requires_grad_()
    x = torch.randn(T, D, generator=g, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(T, D, generator=g, device="cuda", dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(E, device="cuda", generator=g)[:K] for _ in range(T)]).int()
    wts = torch.rand(T, K, generator=g, device="cuda").softmax(-1)
    params = [gate_up, w2]
    gib = 2 ** 30
    print(f"deepseek-v3 layer: T={T}, expert weights {sum(p.numel() * 2 for p in params) / gib:.1f} GiB")

    def moeblaze_step():
        mbt.moe(x, gate_up, None, w2, topk_ids=ids, topk_weights=wts).y.backward(dy)

    def grouped_mm_step():
        torch_grouped_mm(x, ids, wts, gate_up[:, :N], gate_up[:, N:], w2).backward(dy)

    def measure(name, step, grads, fused=True):
        """grads: 'none' (each step starts without gradients), 'bf16' (.grad present),
        'main_grad' (fp32 main_grad present, .grad None)."""
        mbt.set_fused_accumulation(fused)

        def prepare():
            for p in params:
                if grads == "none":
                    p.grad = None
                elif grads == "bf16" and p.grad is None:
                    p.grad = torch.zeros_like(p)
        for p in params:
            p.grad = None
            if grads == "main_grad":
                p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="cuda")
            elif hasattr(p, "main_grad"):
                del p.main_grad

        def run():
            prepare()
            step()
        ms, _ = median_ms(run, args.steps)
        prepare()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / gib
        for p in params:
            p.grad = None
            if hasattr(p, "main_grad"):
                del p.main_grad
        torch.cuda.empty_cache()
        mbt.set_fused_accumulation(True)
        row = {"impl": name, "grads": grads, "fused": fused, "step_ms": ms, "peak_gib": peak}
        print(f"  {name:<34} grads {grads:<9} {ms:9.2f} ms   peak +{peak:6.2f} GiB")
        return row

    def gradient_scales():
        """Each weight's gradient RMS: the checks' starting gradients are drawn at this scale, so
        that a kernel ignoring them (or adding them twice) is far outside the tolerance."""
        for p in params:
            p.grad = None
        moeblaze_step()
        scales = [(sum(float(p.grad[e].float().square().sum()) for e in range(E)) / p.numel()) ** 0.5 for p in params]
        for p in params:
            p.grad = None
        return scales

    scales = gradient_scales()

    def check():
        """The fused accumulation against autograd's fresh gradient + add, from the same random
        existing gradients: relative (Frobenius) difference and how many elements differ."""
        start = [torch.randn(p.shape, generator=g, device="cuda", dtype=torch.bfloat16).mul_(sc)
                 for p, sc in zip(params, scales)]
        out = {}
        for fused in (True, False):
            mbt.set_fused_accumulation(fused)
            for p, s in zip(params, start):
                p.grad = s.clone() if fused else s
            moeblaze_step()
            out[fused] = [p.grad for p in params]
            for p in params:
                p.grad = None
        mbt.set_fused_accumulation(True)
        num = den = 0.0
        differ = 0
        for a, b in zip(out[True], out[False]):
            for e in range(E):  # one expert at a time: an fp32 copy of a whole gradient is 30 GB
                num += float((a[e].float() - b[e].float()).square().sum())
                den += float(b[e].float().square().sum())
                differ += int((a[e] != b[e]).sum())
        total = sum(p.numel() for p in params)
        res = {"rel_vs_fresh_plus_add": (num / den) ** 0.5, "elements_differing": differ, "elements": total}
        print(f"  fused accumulation vs fresh + add: rel {res['rel_vs_fresh_plus_add']:.2e}, "
              f"{differ} of {total} elements differ")
        del out, start
        torch.cuda.empty_cache()
        return res

    def check_main_grad():
        """The fp32 main_grad accumulation against the main gradient it started from plus the
        fresh bf16 gradient (which rounds once more: agreement to bf16 precision, not bitwise).
        The start is regenerated expert by expert from per-expert seeds, so no copy of the
        45 GB of main gradients is held."""
        def start(i, e):
            ge = torch.Generator(device="cuda").manual_seed(1000 * i + e)
            return torch.randn(params[i].shape[1:], generator=ge, device="cuda") * scales[i]
        for i, p in enumerate(params):
            p.grad = None
            p.main_grad = torch.empty(p.shape, dtype=torch.float32, device="cuda")
            for e in range(E):
                p.main_grad[e] = start(i, e)
        moeblaze_step()
        fused = [p.main_grad for p in params]
        for p in params:
            del p.main_grad
        moeblaze_step()  # fresh bf16 gradients
        num = den = 0.0
        for i, (p, m) in enumerate(zip(params, fused)):
            for e in range(E):
                fresh = p.grad[e].float()
                num += float((m[e] - start(i, e) - fresh).square().sum())
                den += float(fresh.square().sum())
            p.grad = None
        del fused
        torch.cuda.empty_cache()
        rel = (num / den) ** 0.5
        print(f"  fused fp32 main_grad vs start + fresh bf16 gradient: rel {rel:.2e} (of the gradient)")
        return rel

    checked = check()
    if args.main_grad:
        checked["main_grad_rel_vs_start_plus_fresh"] = check_main_grad()
    rows = [
        measure("moeblaze, accumulate in epilogue", moeblaze_step, "bf16"),
        measure("moeblaze, fresh grads + autograd add", moeblaze_step, "bf16", fused=False),
        measure("moeblaze, no previous grads", moeblaze_step, "none"),
        measure("torch._grouped_mm autograd", grouped_mm_step, "bf16"),
        measure("torch._grouped_mm, no previous grads", grouped_mm_step, "none"),
    ]
    if args.main_grad:
        rows.insert(1, measure("moeblaze, add into fp32 main_grad", moeblaze_step, "main_grad"))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"shape": {"E": E, "K": K, "d": D, "n": N, "T": T},
                                         "device": torch.cuda.get_device_name(), "check": checked,
                                         "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    if checked["rel_vs_fresh_plus_add"] > 1e-2 or checked.get("main_grad_rel_vs_start_plus_fresh", 0) > 1e-2:
        raise SystemExit(f"accumulate: a fused accumulation differs from fresh gradients + add beyond 1e-2: {checked}")


if __name__ == "__main__":
    main()
