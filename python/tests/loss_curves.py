"""The training comparison of test_torch_gpu.py::test_training_loss_curves_agree, as a tool that
tells kernel drift from noise.

The model: three residual MoE layers (E=16, K=2, d=n=128, SwiGLU, softmax router renormalised
over the picks) and a linear head, bf16 weights, trained 200 steps with AdamW (lr 1e-3) on 256
random tokens a step to fit sin(x_0); the same weights and data for every implementation of
the MoE layers:

  moeblaze    the kernels (moeblaze.torch.MoE); GPU only
  eager32     moeblaze.reference: float32 math on the bf16 weights, y rounded to bf16 once
  eager64     the same in float64
  emulated    eager32 with moeblaze's bf16 rounding points: H = [A|B], h and o in forward; dA/dB,
              each slot's dx, the router's d logits and its dx in backward (docs/design.md
              "Kernels"); what a correct bf16 implementation of the kernels' design computes
  eager_bf16  every op in bf16 (transformers' eager experts with bf16 weights)

Each step's loss differs between implementations by rounding, and the weight updates (AdamW on
bf16 weights) carry that into the next steps, so the curves are compared over 10-step windows.
eager32 vs eager64 is the floor of two implementations that differ only in fp32 rounding;
emulated vs eager32 is what bf16 rounding points cost on this curve; moeblaze vs emulated is
drift: with the kernels right it is about the floor, not about emulated vs eager32.

    python3 python/tests/loss_curves.py                    # on a GPU: every implementation
    python3 python/tests/loss_curves.py --device cpu --impls eager32 eager64 emulated
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

import torch
import torch.nn.functional as F

E, K, D, N, T, LAYERS, STEPS, WINDOW = 16, 2, 128, 128, 256, 3, 200, 10
IMPLS = ("moeblaze", "eager32", "eager64", "emulated", "eager_bf16")


# ---- bf16 rounding points for autograd --------------------------------------------------------

class _Round(torch.autograd.Function):
    """Rounds to bf16 (keeping the dtype) in forward and/or its gradient in backward."""

    @staticmethod
    def forward(ctx, t, fwd: bool, bwd: bool):
        ctx.bwd = bwd
        return t.to(torch.bfloat16).to(t.dtype) if fwd else t.clone()

    @staticmethod
    def backward(ctx, g):
        return (g.to(torch.bfloat16).to(g.dtype) if ctx.bwd else g), None, None


def rounded(t, fwd=True, bwd=False):
    return _Round.apply(t, fwd, bwd)


def grad_rounded(t):
    return _Round.apply(t, False, True)


# ---- the MoE layer by implementation ----------------------------------------------------------

def _route(x, w_router, points: bool = False):
    """Renormalised softmax top-k (ids, gates), as moeblaze's router; `points`: the kernels'
    d logits are bf16."""
    logits = x @ w_router.t()
    if points:
        logits = grad_rounded(logits)
    p = logits.softmax(-1)
    _, ids = p.topk(K, dim=-1)
    g = p.gather(-1, ids)
    return ids, g / g.sum(-1, keepdim=True)


def _experts(x, ids, g, w1, w3, w2, points: bool):
    """sum_j g_tj expert_{e_tj}(x_t), expert by expert; `points`: moeblaze's rounding points."""
    y = torch.zeros(x.shape[0], w2.shape[1], dtype=x.dtype, device=x.device)
    for e in range(w1.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        if points:  # each slot's dx is rounded to bf16 before the sum over the token's picks
            xe = grad_rounded(xe)
        a, b = xe @ w1[e].t(), xe @ w3[e].t()
        if points:  # H saved in bf16, and dA, dB written in bf16
            a, b = rounded(a, bwd=True), rounded(b, bwd=True)
        h = F.silu(a) * b
        if points:  # h rounded from the bf16 H
            h = rounded(h)
        o = h @ w2[e].t()
        if points:
            o = rounded(o)
        y = y.index_add(0, tok, o * g[tok, slot].unsqueeze(-1))
    return y


def moe_layer(impl: str, m, x):
    """The MoE layer `m` (a moeblaze.torch.MoE: its weights) on x [T, d] bf16, by `impl`."""
    if impl == "moeblaze":
        return m(x).y
    if impl == "eager32":  # exactly what the test compares against
        from moeblaze.reference import ReferenceMoE
        return ReferenceMoE(m)(x)
    if impl == "eager_bf16":
        ids, g = _route(x.float(), m.gate.weight.float())
        return _experts(x, ids, g.to(torch.bfloat16), m.w1, m.w3, m.w2, False)
    dt = torch.float64 if impl == "eager64" else torch.float32
    points = impl == "emulated"
    xf = x.to(dt)
    # the router's dx (router_dgrad's output) is bf16 in the kernels before the experts' part is added
    ids, g = _route(grad_rounded(xf) if points else xf, m.gate.weight.to(dt), points)
    y = _experts(xf, ids, g, m.w1.to(dt), m.w3.to(dt), m.w2.to(dt), points)
    return y.to(x.dtype)


# ---- the training run -------------------------------------------------------------------------

def make_model(device):
    """The test's model, built as the test builds it (every layer from seed 0, then the head):
    the same weights for every implementation."""
    import moeblaze.torch as mbt
    layers = []
    for _ in range(LAYERS):
        torch.manual_seed(0)
        layers.append(mbt.MoE(E, K, D, N, router="softmax", renormalize=True, device=device))
    layers = torch.nn.ModuleList(layers)
    head = torch.nn.Linear(D, 1, device=device, dtype=torch.bfloat16)
    return layers, head


def train(impl: str, device="cuda", steps: int = STEPS, data_seed: int = 5) -> List[float]:
    """The loss of every step (the test's run: data seed 5)."""
    layers, head = make_model(device)
    opt = torch.optim.AdamW(list(layers.parameters()) + list(head.parameters()), lr=1e-3)
    g = torch.Generator(device=device).manual_seed(data_seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(T, D, device=device, dtype=torch.bfloat16, generator=g)
        target = x[:, :1].float().sin()
        h = x
        for m in layers:
            h = h + moe_layer(impl, m, h)
        loss = F.mse_loss(head(h).float(), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def window_differences(a: List[float], b: List[float]) -> torch.Tensor:
    """|mean_w(a) - mean_w(b)| / |mean_w(b)| per window of WINDOW steps."""
    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    wa, wb = ta.view(-1, WINDOW).mean(1), tb.view(-1, WINDOW).mean(1)
    return (wa - wb).abs() / wb.abs()


PAIRS = (("moeblaze", "eager32"), ("moeblaze", "emulated"), ("moeblaze", "eager64"), ("emulated", "eager32"),
         ("emulated", "eager64"), ("eager64", "eager32"), ("eager_bf16", "eager32"))


def report(curves: Dict[str, List[float]]) -> str:
    lines = [f"windows of {WINDOW} steps, relative difference of the window means in %"]
    for a, b in PAIRS:
        if a in curves and b in curves:
            w = window_differences(curves[a], curves[b]) * 100
            lines.append(f"{a:>10} vs {b:<9} max {w.max():6.3f}  mean {w.mean():6.3f}  | " +
                         " ".join(f"{v:.2f}" for v in w.tolist()))
    for name, c in curves.items():
        lines.append(f"{name:>10}: first {WINDOW} steps {sum(c[:WINDOW]) / WINDOW:.5f}, last {WINDOW} "
                     f"{sum(c[-WINDOW:]) / WINDOW:.5f}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=None)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--data-seeds", type=int, nargs="+", default=[5],
                   help="one table per seed of the training data (the test's is 5); more seeds, more samples")
    a = p.parse_args(argv)
    impls = a.impls or [i for i in IMPLS if a.device == "cuda" or i != "moeblaze"]
    if a.steps <= 0 or a.steps % WINDOW:
        p.error(f"--steps: a positive multiple of {WINDOW}")
    for seed in a.data_seeds:
        curves = {}
        for impl in impls:
            curves[impl] = train(impl, a.device, a.steps, seed)
            print(f"data seed {seed}, {impl}: done", file=sys.stderr, flush=True)
        print(f"data seed {seed}:")
        print(report(curves))


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ""))
    main()
