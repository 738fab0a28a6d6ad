"""Where the peak memory of a training step goes, per implementation (diagnostic for
bench/suite.py's peak column): extra memory at the peak with gradients produced by
.backward() (accumulated into fresh .grad) and by torch.autograd.grad, and whether autograd
kept the layer's weight-gradient tensors as .grad or copied them.

Usage: python3 bench/memory_probe.py [--shapes mixtral-8x7b,qwen3-30b-a3b]"""
import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import moeblaze.torch as mbt  # noqa: E402
from baselines import torch_grouped_mm  # noqa: E402
from moeblaze.reference import route  # noqa: E402

SUITE = {s["name"]: s for s in json.loads((HERE / "suite.json").read_text())["shapes"]}


def probe(shape, impl):
    E, K, d, n, T = shape["E"], shape["K"], shape["d"], shape["n"], shape["T"]
    kw = dict(device="cuda", dtype=torch.bfloat16)
    w1 = (torch.randn(E, n, d, **kw) * d ** -0.5).requires_grad_()
    w3 = (torch.randn(E, n, d, **kw) * d ** -0.5).requires_grad_()
    w2 = (torch.randn(E, d, n, **kw) * n ** -0.5).requires_grad_()
    wr = (torch.randn(E, d, **kw) * d ** -0.5).requires_grad_()
    x = torch.randn(T, d, **kw).requires_grad_()
    dy = torch.randn(T, d, **kw)
    params = [w1, w3, w2, wr]
    wg = sum(p.numel() * p.element_size() for p in params)

    def fwd():
        if impl == "moeblaze":
            return mbt.moe(x, w1, w3, w2, w_router=wr, router="softmax", top_k=K).y
        ids, w = route(x, wr, K, "softmax", True, 1.0, None)
        return torch_grouped_mm(x, ids, w, w1, w3, w2)

    out = {"shape": shape["name"], "impl": impl, "weight_grads_mib": wg / 2 ** 20}
    for mode in ("backward", "autograd.grad", "backward"):
        for t in params + [x]:
            t.grad = None
        seen = {}
        hooks = [p.register_hook(lambda g, i=i: seen.__setitem__(i, g.data_ptr())) for i, p in enumerate(params)]
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = fwd()
        act = torch.cuda.memory_allocated() - base
        if mode == "backward":
            y.backward(dy)
            kept = [seen.get(i) == p.grad.data_ptr() for i, p in enumerate(params)]
        else:
            gs = torch.autograd.grad(y, [x] + params, dy)
            kept = None
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        for h in hooks:
            h.remove()
        out[mode] = {"after_forward_mib": act / 2 ** 20, "peak_mib": peak / 2 ** 20,
                     "peak_minus_weight_grads_mib": (peak - wg) / 2 ** 20, "grad_tensors_kept": kept}
        del y
        if mode != "backward":
            del gs
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="mixtral-8x7b,qwen3-30b-a3b")
    a = ap.parse_args()
    unknown = [n for n in a.shapes.split(",") if n not in SUITE]
    if unknown:
        sys.exit(f"--shapes: unknown {unknown} (suite shapes: {', '.join(SUITE)})")
    for name in a.shapes.split(","):
        for impl in ("moeblaze", "torch-grouped_mm"):
            print(json.dumps(probe(SUITE[name], impl)), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
