"""Pure-PyTorch MoE, the Hugging Face style loop over experts: the reference the binding's
tests compare against (same weights, same layouts), and a baseline for the benchmark."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


# GPT-OSS's clamped SwiGLU: h = glu(min(a, L)) * (clamp(b, -L, L) + 1), glu(a) = a sigmoid(alpha a).
CLAMPED_SWIGLU_ALPHA, CLAMPED_SWIGLU_LIMIT = 1.702, 7.0
GATED = ("swiglu", "geglu", "clamped_swiglu")


def activation(name: str, a: Tensor) -> Tensor:
    """The activation `name` of the first (gate) projection `a`, as the kernels compute it:
    silu (swiglu, silu), the tanh approximation of gelu (geglu, gelu), relu, or GPT-OSS's
    clamped form (clamped_swiglu: min(a, 7) sigmoid(1.702 min(a, 7)))."""
    if name == "clamped_swiglu":
        a = a.clamp(max=CLAMPED_SWIGLU_LIMIT)
        return a * torch.sigmoid(CLAMPED_SWIGLU_ALPHA * a)
    if name in ("swiglu", "silu"):
        return F.silu(a)
    if name in ("geglu", "gelu"):
        return F.gelu(a, approximate="tanh")
    if name == "relu":
        return F.relu(a)
    raise ValueError(f"activation: unknown '{name}'")


def route(x: Tensor, w_router: Tensor, top_k: int, router: str = "softmax", renormalize: bool = False,
          route_scale: float = 1.0, bias: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """(topk_ids int32 [T,K], gates f32 [T,K]) as moeblaze's built-in router defines them."""
    logits = (x.float() @ w_router.float().t())
    if router == "softmax":
        scores = logits.softmax(-1)
        key = scores
    else:
        scores = logits.sigmoid()
        key = scores + (bias.float() if bias is not None else 0)
    _, ids = key.topk(top_k, dim=-1)
    gates = scores.gather(-1, ids)
    if renormalize:
        gates = gates / gates.sum(-1, keepdim=True)
    return ids.int(), gates * route_scale


def up_part(name: str, b: Tensor) -> Tensor:
    """The up (W3) factor of a gated activation: b, or GPT-OSS's clamp(b, -L, L) + 1."""
    if name == "clamped_swiglu":
        return b.clamp(-CLAMPED_SWIGLU_LIMIT, CLAMPED_SWIGLU_LIMIT) + 1
    return b


def moe(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, w1: Tensor, w3: Optional[Tensor], w2: Tensor,
        act: str = "swiglu", bias_up: Optional[Tensor] = None, bias_down: Optional[Tensor] = None) -> Tensor:
    """y = sum_j g_tj * expert_{e_tj}(x_t), computed per expert with masks and index_add in
    float32 (inputs upcast), differentiable in every input. A gated activation with w3=None
    reads w1 as the fused gate_up [E, 2n, d] (each expert's W1 rows, then its W3 rows).
    bias_up [E, G*n] ([gate | up] per expert) is added to A (and B), bias_down [E, d] to o."""
    T, d = x.shape
    E = w1.shape[0]
    n = w2.shape[2]
    if w3 is None and act in GATED:  # fused gate_up
        w1, w3 = w1[:, :n], w1[:, n:]
    gated = w3 is not None  # act(A) * up(B) with any activation, as given
    xf = x.float()
    y = torch.zeros(T, d, dtype=torch.float32, device=x.device)
    for e in range(E):
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xe = xf[tok]
        a = xe @ w1[e].float().t()
        if bias_up is not None:
            a = a + bias_up[e, :n].float()
        if gated:
            b = xe @ w3[e].float().t()
            if bias_up is not None:
                b = b + bias_up[e, n:].float()
            h = activation(act, a) * up_part(act, b)
        else:
            h = activation(act, a)
        o = h @ w2[e].float().t()
        if bias_down is not None:
            o = o + bias_down[e].float()
        y = y.index_add(0, tok, o * topk_weights[tok, slot].float().unsqueeze(-1))
    return y


class ReferenceMoE(torch.nn.Module):
    """The same layer as moeblaze.torch.MoE, in plain PyTorch (float32 math on bf16 weights)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states: Tensor, topk_ids: Optional[Tensor] = None,
                topk_weights: Optional[Tensor] = None) -> Tensor:
        m = self.layer
        lead = hidden_states.shape[:-1]
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        if m.router is not None:
            topk_ids, topk_weights = route(x, m.gate.weight, m.cfg[1], m.router, bool(m.cfg[6]), m.route_scale,
                                           m.e_score_correction_bias)
        y = moe(x, topk_ids, topk_weights, m.w1, m.w3, m.w2, m.activation)
        return y.to(hidden_states.dtype).reshape(*lead, -1)
