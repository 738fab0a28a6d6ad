"""The local expert compute of expert parallelism: every received row is one (token, k) slot
routed to one local expert, so each row is x_row -> g * expert(x_row) (K = 1 in moeblaze's
terms), with the gate gradient <dy_row, expert(x_row)> coming back from backward.

The gate is applied by the expert compute (not at the combine) because then moeblaze's
down-projection dgrad gives the gate gradient as a row-dot it computes anyway; the
alternative (weight 1, gate at the combine) would have to keep every expert output o
[T*K, d] until backward to form <dy, o>.

An engine is any object with
    forward(rows [N,d], expert_ids int32 [N], gates [N], w1, w3, w2) -> (out [N,d], state)
    backward(state, d_out [N,d]) -> (d_rows, d_gates, dw1, dw3 or None, dw2)
where the weights are the chunk's local experts [E_c, n, d] / [E_c, d, n] and N >= 1 (the
layer skips empty chunks). `MoeblazeExperts` runs the moeblaze kernels; `TorchExperts` is a
plain-PyTorch one (reference, CPU tests)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from . import _capi as C
from ._routing import narrow_expert_ids
from .reference import activation as _activation

_TILES = {"tuned": 0, "default": 1}


class MoeblazeExperts:
    """moeblaze's layer with caller routing and K = 1 on the received rows (bf16 rows and
    weights, float32 gates).

    tiles="tuned" loads the cache's winners for the local shape (else the default tiles);
    "default" always runs the default tiles, compiled without the cache, so that the tiles and
    hence the bits do not depend on what was tuned (the default tiles of a shape do not depend
    on its expert count in any way that changes results; see docs/expert-parallelism.md, Numerics)."""

    def __init__(self, activation: str = "swiglu", checkpoint: str = "save-h", tiles: str = "tuned"):
        if activation not in C.ACTIVATIONS:
            raise C.InvalidArgument("activation", f"activation: '{activation}' is not one of {sorted(C.ACTIVATIONS)}")
        if checkpoint not in C.MODES:
            raise C.InvalidArgument("checkpoint", f"checkpoint: '{checkpoint}' is not one of save-h, recompute")
        if tiles not in _TILES:
            raise C.InvalidArgument("tiles", f"tiles: '{tiles}' is not one of tuned, default")
        self.activation, self.mode, self.tiles = activation, C.MODES[checkpoint], _TILES[tiles]
        from . import torch as _mbt  # noqa: F401  (registers torch.ops.moeblaze)

    def _cfg(self, w1: Tensor) -> list:
        E, n, d = w1.shape
        # ..., router none, no renormalisation, separate W1/W3, no expert biases, the tiles
        return [E, 1, d, n, C.ACTIVATIONS[self.activation], 0, 0, 0, 0, self.tiles]

    def forward(self, rows: Tensor, expert_ids: Tensor, gates: Tensor, w1: Tensor, w3: Optional[Tensor],
                w2: Tensor) -> Tuple[Tensor, Any]:
        cfg = self._cfg(w1)
        ids = narrow_expert_ids(expert_ids, w1.shape[0]).view(-1, 1)
        g = gates.to(torch.float32).reshape(-1, 1).contiguous()
        # No routing check (it would sync every chunk): the received ids come from the exchanged
        # counts, always in range, and the device-split path's padding rows carry E_local on
        # purpose, for the index build to leave out.
        out, saved, state, _, _ = torch.ops.moeblaze.forward(rows.contiguous(), ids, g, None, None, w1, w3, w2,
                                                             None, None, cfg, 1.0, self.mode, False)
        return out, (rows, g, w1, w3, w2, saved, state, cfg, gates.dtype)

    def backward(self, state: Any, d_out: Tensor):
        rows, g, w1, w3, w2, saved, st, cfg, gate_dtype = state
        dx, dw1, dw3, dw2, dg, _, _, _ = torch.ops.moeblaze.backward(d_out.contiguous(), rows, g, None, None, w1, w3,
                                                                     w2, None, None, saved, st, cfg, 1.0)
        return dx, dg.view(-1).to(gate_dtype), dw1, dw3 if w3 is not None else None, dw2


class TorchExperts:
    """The same compute in plain PyTorch: per local expert, o = act(x W1^T) [* x W3^T] W2^T,
    out = g * o, in the promoted precision of the inputs (at least float32) and rounded to the
    rows' dtype; backward by autograd through it. Any activation of moeblaze.reference, with
    or without w3 (w3 makes it gated)."""

    def __init__(self, activation: str = "swiglu"):
        self.activation = activation

    def _compute(self, rows, expert_ids, gates, w1, w3, w2):
        acc = torch.promote_types(rows.dtype, torch.float32)
        out = torch.zeros(rows.shape[0], w2.shape[1], dtype=acc, device=rows.device)
        ids = expert_ids.long()
        for e in range(w1.shape[0]):
            sel = (ids == e).nonzero().view(-1)
            if sel.numel() == 0:
                continue
            x = rows.index_select(0, sel).to(acc)
            a = x @ w1[e].to(acc).t()
            h = _activation(self.activation, a)
            if w3 is not None:
                h = h * (x @ w3[e].to(acc).t())
            o = h @ w2[e].to(acc).t()
            out = out.index_copy(0, sel, gates.index_select(0, sel).to(acc).unsqueeze(-1) * o)
        return out.to(rows.dtype)

    def forward(self, rows, expert_ids, gates, w1, w3, w2):
        leaves = [t.detach().requires_grad_() if t is not None else None for t in (rows, gates, w1, w3, w2)]
        with torch.enable_grad():
            out = self._compute(leaves[0], expert_ids, *leaves[1:])
        return out.detach(), (leaves, out)

    def backward(self, state, d_out):
        leaves, out = state
        used = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(out, used, d_out, allow_unused=True))
        result = []
        for t in leaves:
            if t is None:
                result.append(None)
                continue
            g = next(grads)
            result.append(torch.zeros_like(t) if g is None else g)
        return tuple(result)
