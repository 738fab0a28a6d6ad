"""Two PyTorch baselines of the suite (docs/performance.md), written here so that they run in the
same invocation as moeblaze: the Hugging Face style loop over experts, and the
torch._grouped_mm recipe (sort by expert, gather, grouped GEMMs, SwiGLU, scale, index_add).
Both take the caller's routing (ids [T,K], weights [T,K]) and weights in moeblaze's layout."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def torch_loop(x, ids, weights, w1, w3, w2):
    """One masked GEMM chain per expert, index_add into y (HF Mixtral/Qwen style)."""
    T, d = x.shape
    y = torch.zeros_like(x)
    mask = F.one_hot(ids.long(), w1.shape[0]).permute(2, 1, 0)  # [E, K, T]
    for e in range(w1.shape[0]):
        slot, tok = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        xe = x[tok]
        h = F.silu(xe @ w1[e].t()) * (xe @ w3[e].t())
        o = (h @ w2[e].t()) * weights[tok, slot, None].to(x.dtype)
        y = y.index_add(0, tok, o)
    return y


ALIGN = 16  # rows per expert group are padded to this (grouped GEMM alignment)


def torch_grouped_mm(x, ids, weights, w1, w3, w2):
    """torchtitan-style: permute tokens by expert (padded groups), three grouped GEMMs."""
    T, d = x.shape
    E, K = w1.shape[0], ids.shape[1]
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    starts = torch.cumsum(padded, 0) - padded
    ends = torch.cumsum(padded, 0).int()
    # position of each sorted slot inside the padded buffer
    rank = torch.arange(flat.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    pos = starts[flat[order]] + rank
    total = int(padded.sum())  # host sync: allowed for a baseline
    xs = x.new_zeros(total, d)
    xs[pos] = x[order // K]
    h = F.silu(torch._grouped_mm(xs, w1.transpose(-2, -1), offs=ends)) * torch._grouped_mm(xs, w3.transpose(-2, -1), offs=ends)
    o = torch._grouped_mm(h, w2.transpose(-2, -1), offs=ends)
    o = o[pos] * weights.reshape(-1)[order, None].to(x.dtype)
    return torch.zeros_like(x).index_add(0, order // K, o)
